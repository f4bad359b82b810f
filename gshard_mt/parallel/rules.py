"""Logical-axis rules: the model names every parameter and key activation with logical axes ('batch', 'embed',
'expert', ...); a strategy is a table mapping them to mesh axes ('data', 'expert', 'model'), so changing the
strategy never touches the model (GShard section 3.1: sharding annotations kept apart from the model's code).
"""

from __future__ import annotations

import math

from gshard_mt.registry import Registry

# Groups and the batch are split over both data-like axes (as in t5x: batch -> ('data', 'expert')), so one mesh
# axis can carry groups and experts at once: the dispatched EGCM tensor moves from G-sharded to E-sharded,
# which is the all-to-all. Flax applies the rules in order, each to the first free dimension of its name whose
# mesh axes are still unused: 'expert' comes first, so a tensor with both E and G (EGCM) gives 'expert' to E and
# G falls back to 'data'.
_COMMON = [("layers", None), ("length", None), ("capacity", None), ("kv", None)]
_BY_EXPERT = [("expert", "expert"), ("batch", ("data", "expert")), ("group", ("data", "expert")), ("group", "data")]
_WHOLE = [("embed", None), ("mlp", None), ("heads", None), ("vocab", None)]
RULES = Registry("partitioning").add({  # config.partitioning: the rule tables
    "data": [("batch", "data"), ("group", "data"), ("expert", None)] + _WHOLE + _COMMON,
    "expert": _BY_EXPERT + _WHOLE + _COMMON,
    "expert_model": _BY_EXPERT + [("embed", None), ("mlp", "model"), ("heads", "model"), ("vocab", "model")] + _COMMON,
})


def rules(config) -> list:
  """The rule table `config.partitioning` names."""
  return RULES[config.partitioning]


def mesh_axes_of(logical: str, axis_rules: list) -> tuple[str, ...]:
  """The mesh axes a dimension named `logical` is split over: those its first rule names (the rule Flax applies to
  it when no other dimension of the tensor has taken those axes); () for none."""
  mesh_axes = next((axes for name, axes in axis_rules if name == logical), None)
  return () if mesh_axes is None else (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)


def devices_of(logical: str, axis_rules: list, mesh_sizes: dict[str, int]) -> int:
  """How many devices a dimension named `logical` is split over: the product of its mesh axes' sizes."""
  return math.prod(mesh_sizes[a] for a in mesh_axes_of(logical, axis_rules))

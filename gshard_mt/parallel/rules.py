"""Logical-axis rules, and GShard's annotation API.

The model names every parameter and key activation with logical axes ('batch', 'embed', 'expert', ...); a
strategy is a table mapping those names to mesh axes ('data', 'expert', 'model'). Changing the parallelism
strategy means changing `config.partitioning` or `config.mesh`, never the model (GShard section 3.1:
sharding annotations are kept apart from the model's code).
"""

from __future__ import annotations

import math

import jax
from jax.sharding import PartitionSpec as P

from gshard_mt.config import choices

# Groups and the batch are split over both data-like axes (as in t5x: batch -> ('data', 'expert')), so one mesh
# axis can carry groups and experts at once: the dispatched EGCM tensor moves from G-sharded to E-sharded,
# which is the all-to-all. Flax applies the rules in order, each to the first free dimension of its name whose
# mesh axes are still unused: 'expert' comes first, so a tensor with both E and G (EGCM) gives 'expert' to E and
# G falls back to 'data'.
_COMMON = [("layers", None), ("length", None), ("capacity", None), ("kv", None)]
RULES = choices.PARTITIONINGS.add({
    "data": [("batch", "data"), ("group", "data"), ("expert", None), ("embed", None), ("mlp", None),
             ("heads", None), ("vocab", None)] + _COMMON,
    "expert": [("expert", "expert"), ("batch", ("data", "expert")), ("group", ("data", "expert")),
               ("group", "data"), ("embed", None), ("mlp", None), ("heads", None), ("vocab", None)] + _COMMON,
    "expert_model": [("expert", "expert"), ("batch", ("data", "expert")), ("group", ("data", "expert")),
                     ("group", "data"),
                     ("embed", None), ("mlp", "model"), ("heads", "model"), ("vocab", "model")] + _COMMON,
})


def rules(config) -> list:
  """The rule table `config.partitioning` names."""
  return RULES[config.partitioning]


# GShard's annotation API (section 3.1): a few annotations on key tensors, the compiler partitions the rest. They
# constrain inside jit under `jax.set_mesh(mesh)`.

def replicate(x: jax.Array) -> jax.Array:
  """The whole tensor on every device."""
  return jax.lax.with_sharding_constraint(x, P())


def split(x: jax.Array, dim: int, mesh_axis: str | tuple[str, ...]) -> jax.Array:
  """Dimension `dim` split over `mesh_axis`, the others replicated."""
  spec = [None] * x.ndim
  spec[dim] = mesh_axis
  return jax.lax.with_sharding_constraint(x, P(*spec))


def shard(x: jax.Array, spec) -> jax.Array:
  """A full specification: one mesh axis (or tuple of axes, or None) per dimension."""
  if len(spec) != x.ndim:
    raise ValueError(f"shard: spec {tuple(spec)} has {len(spec)} entries for a rank-{x.ndim} tensor")
  return jax.lax.with_sharding_constraint(x, P(*spec))


def devices_of(logical: str, axis_rules: list, mesh_sizes: dict[str, int]) -> int:
  """How many devices a dimension named `logical` is split over: the product of the mesh axes its first rule
  names (the rule Flax applies to it when no other dimension of the tensor has taken those axes)."""
  mesh_axes = next((axes for name, axes in axis_rules if name == logical), None)
  if mesh_axes is None:
    return 1
  return math.prod(mesh_sizes[a] for a in ((mesh_axes,) if isinstance(mesh_axes, str) else mesh_axes))

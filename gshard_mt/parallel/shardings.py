"""Shardings of the train state and the batch, all derived from logical axis names and the rules.

Parameters carry logical axes (`nn.with_logical_partitioning`); the optimizer state's axes are derived from them
through the optimizer's own structure (`optax.tree_map_params`), as t5x derives them, never matched by name.
"""

from __future__ import annotations

import flax.linen as nn
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

BATCH_AXES = ("batch", "length")  # every batch array is [rows, length]


def param_shardings(boxed_params, mesh, axis_rules):
  """NamedShardings of a (boxed, possibly abstract) parameter tree from its logical axis names."""
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed_params), mesh, axis_rules)


def leaf_axes(param_axes: tuple, param_shape: tuple, leaf_shape: tuple) -> tuple:
  """Logical axes of an optimizer-state leaf kept for a parameter: the parameter's for the same shape (Adam's
  moments), less the reduced dimension for a factored statistic (Adafactor's), else replicated (placeholders, or
  two dimensions of equal size that make the reduced one ambiguous)."""
  if tuple(leaf_shape) == tuple(param_shape):
    return tuple(param_axes)
  if len(leaf_shape) == len(param_shape) - 1:
    reduced = [i for i in range(len(param_shape)) if tuple(np.delete(param_shape, i)) == tuple(leaf_shape)]
    if len(reduced) == 1:
      return tuple(np.delete(np.array(param_axes, dtype=object), reduced[0]))
  return (None,) * len(leaf_shape)


def optimizer_shardings(tx: optax.GradientTransformation, opt_state, boxed_params, mesh, axis_rules):
  """NamedShardings of an (abstract) optimizer state: per-parameter leaves get axes from their parameter's
  (`leaf_axes`), the rest is replicated."""
  specs = nn.get_partition_spec(boxed_params)
  params = nn.unbox(boxed_params)
  axes = optax.tree_map_params(tx, lambda leaf, spec, param: P(*leaf_axes(tuple(spec), param.shape, leaf.shape)),
                               opt_state, specs, params, transform_non_params=lambda _: P(),
                               is_leaf=lambda x: isinstance(x, P))
  return nn.logical_to_mesh_sharding(axes, mesh, axis_rules)


def batch_sharding(mesh, axis_rules) -> NamedSharding:
  """Rows of a batch array, split as the rules split the logical 'batch' axis (the same for every batch key)."""
  return NamedSharding(mesh, nn.logical_to_mesh_axes(BATCH_AXES, axis_rules))

"""Device mesh, logical-axis rules and the shardings of the train state and batch.

The model names every parameter and key activation with logical axes ('batch', 'embed', 'expert', ...); a
strategy is a table mapping those names to mesh axes ('data', 'expert', 'model'). Changing the parallelism
strategy means changing `config.partitioning` or `config.mesh`, never the model (seed 002's axis_resources).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import flax.linen as nn

MESH_AXES = ("data", "expert", "model")

# Groups and the batch are split over both data-like axes (as in t5x: batch -> ('data', 'expert')), so one mesh
# axis can carry groups and experts at once: the dispatched EGCM tensor moves from G-sharded to E-sharded,
# which is the all-to-all.
_COMMON = [("layers", None), ("length", None), ("capacity", None), ("kv", None)]
RULES = {
    "data": [("batch", "data"), ("group", "data"), ("expert", None), ("embed", None), ("mlp", None),
             ("heads", None), ("vocab", None)] + _COMMON,
    "expert": [("batch", ("data", "expert")), ("group", ("data", "expert")), ("expert", "expert"),
               ("embed", None), ("mlp", None), ("heads", None), ("vocab", None)] + _COMMON,
    "expert_model": [("batch", ("data", "expert")), ("group", ("data", "expert")), ("expert", "expert"),
                     ("embed", None), ("mlp", "model"), ("heads", "model"), ("vocab", "model")] + _COMMON,
}


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, int, int]:
  """(data, expert, model) sizes; data = -1 takes the devices the other axes leave."""
  expert, model = mesh_config.expert, mesh_config.model
  data = mesh_config.data
  if data == -1:
    if num_devices % (expert * model):
      raise ValueError(f"mesh.expert={expert} x mesh.model={model} does not divide the {num_devices} devices")
    data = num_devices // (expert * model)
  if data * expert * model != num_devices:
    raise ValueError(f"mesh data={data} x expert={expert} x model={model} = {data * expert * model} does not "
                     f"match the {num_devices} devices")
  return data, expert, model


def make_mesh(config, devices=None) -> jax.sharding.Mesh:
  devices = list(devices if devices is not None else jax.devices())
  shape = mesh_shape(config.mesh, len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3, devices=devices)


def rules(config) -> list:
  return RULES[config.partitioning]


def param_shardings(boxed_params, mesh, axis_rules):
  """NamedShardings of a (boxed, possibly abstract) parameter tree from its logical axis names."""
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed_params), mesh, axis_rules)


def like_params_shardings(tree, params, params_shardings, mesh):
  """Shardings for a tree whose leaves mirror parameters (optimizer state): a leaf whose key path ends with a
  parameter's path and has its shape gets that parameter's sharding; anything else (counts, factored
  statistics) is replicated."""
  by_path = {path: (leaf.shape, sharding) for (path, leaf), sharding in zip(
      jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(params_shardings))}
  replicated = NamedSharding(mesh, P())

  def pick(path, leaf):
    for k in range(len(path)):
      if path[k:] in by_path and by_path[path[k:]][0] == leaf.shape:
        return by_path[path[k:]][1]
    return replicated

  return jax.tree_util.tree_map_with_path(pick, tree)


def batch_sharding(mesh) -> NamedSharding:
  """Rows of the batch split over the data-like axes."""
  return NamedSharding(mesh, P(("data", "expert")))


def global_batch(local_batch: dict, mesh) -> dict:
  """This process's rows -> global jax.Arrays sharded over the data-like axes (multi-process safe)."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local_batch.items()}

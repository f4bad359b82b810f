"""Device mesh, logical-axis rules and the shardings of the train state and batch.

The model names every parameter and key activation with logical axes ('batch', 'embed', 'expert', ...); a
strategy is a table mapping those names to mesh axes ('data', 'expert', 'model'). Changing the parallelism
strategy means changing `config.partitioning` or `config.mesh`, never the model (seed 002's axis_resources).
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import NamedSharding, PartitionSpec as P

import flax.linen as nn

from gshard_mt import config as config_lib

MESH_AXES = ("data", "expert", "model")

# Groups and the batch are split over both data-like axes (as in t5x: batch -> ('data', 'expert')), so one mesh
# axis can carry groups and experts at once: the dispatched EGCM tensor moves from G-sharded to E-sharded,
# which is the all-to-all. Flax applies the rules in order, each to the first free dimension of its name whose
# mesh axes are still unused: 'expert' comes first, so a tensor with both E and G (EGCM) gives 'expert' to E and
# G falls back to 'data'.
_COMMON = [("layers", None), ("length", None), ("capacity", None), ("kv", None)]
RULES = {
    "data": [("batch", "data"), ("group", "data"), ("expert", None), ("embed", None), ("mlp", None),
             ("heads", None), ("vocab", None)] + _COMMON,
    "expert": [("expert", "expert"), ("batch", ("data", "expert")), ("group", ("data", "expert")),
               ("group", "data"), ("embed", None), ("mlp", None), ("heads", None), ("vocab", None)] + _COMMON,
    "expert_model": [("expert", "expert"), ("batch", ("data", "expert")), ("group", ("data", "expert")),
                     ("group", "data"),
                     ("embed", None), ("mlp", "model"), ("heads", "model"), ("vocab", "model")] + _COMMON,
}


def initialize_distributed(config) -> bool:
  """Starts JAX's multi-process runtime when the config asks for it; returns whether it did. Call it before
  anything else touches the devices."""
  d = config.distributed
  if d.auto:
    jax.distributed.initialize()
    return True
  if d.num_processes > 1:
    if not d.coordinator_address:
      raise config_lib.ConfigError("distributed.num_processes > 1 needs distributed.coordinator_address "
                                   "(host:port of process 0)")
    jax.distributed.initialize(coordinator_address=d.coordinator_address, num_processes=d.num_processes,
                               process_id=d.process_id)
    return True
  return False


def make_mesh(config, devices=None) -> jax.sharding.Mesh:
  """The ('data', 'expert', 'model') mesh; with dcn_mesh > 1 a hybrid one whose slices are contiguous blocks,
  so only the axes that span slices cross the slow network (seed 004's islands)."""
  devices = list(devices if devices is not None else jax.devices())
  axis_types = (jax.sharding.AxisType.Auto,) * 3
  dcn = config_lib.dcn_shape(config)
  if dcn == (1, 1, 1):
    return jax.make_mesh(config_lib.mesh_shape(config, len(devices)), MESH_AXES, axis_types=axis_types,
                         devices=devices)
  ici = config_lib.ici_shape(config, len(devices))
  # TPU devices say which slice they are on; elsewhere (GPU hosts, CPU tests) a process is a slice.
  by_slice = len({getattr(d, "slice_index", None) for d in devices}) > 1
  granules = len({d.slice_index if by_slice else d.process_index for d in devices})
  if granules != math.prod(dcn):
    raise config_lib.ConfigError(
        f"dcn_mesh data={dcn[0]} x expert={dcn[1]} x model={dcn[2]} asks for {math.prod(dcn)} slices, but the "
        f"{len(devices)} devices are on {granules} {'slices' if by_slice else 'processes'} (one process is one slice "
        "off TPU)")
  array = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=not by_slice)
  return jax.sharding.Mesh(array, MESH_AXES, axis_types=axis_types)


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


# GShard's annotation API (seed 001): a few annotations on key tensors, the compiler partitions the rest. They
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


def batch_sharding(mesh) -> NamedSharding:
  """Rows of the batch split over the data-like axes."""
  return NamedSharding(mesh, P(("data", "expert")))


def process_rows(batch: dict) -> dict:
  """This process's share of the rows of a batch that every process built whole (evaluation batches)."""
  n, i = jax.process_count(), jax.process_index()
  rows = len(next(iter(batch.values())))
  if rows % n:
    raise ValueError(f"{rows} rows do not split over {n} processes")
  return {k: v[i * rows // n:(i + 1) * rows // n] for k, v in batch.items()}


def global_batch(local_batch: dict, mesh) -> dict:
  """This process's rows -> global jax.Arrays sharded over the data-like axes (multi-process safe)."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local_batch.items()}

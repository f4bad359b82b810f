"""Multi-process runs: starting JAX's distributed runtime, each process's share of the batch, and what the
processes of one command exchange (process 0's input and its errors, every process's outputs)."""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from gshard_mt import io
from gshard_mt.errors import ConfigError, UserError
from gshard_mt.parallel import mesh as mesh_lib
from gshard_mt.parallel import rules as rules_lib
from gshard_mt.parallel.shardings import batch_sharding


def initialize_distributed(config) -> bool:
  """Starts JAX's multi-process runtime when the config asks for it (before anything touches the devices);
  returns whether it did."""
  d = config.distributed
  if d.auto:
    jax.distributed.initialize()
  elif d.num_processes > 1:
    if not d.coordinator_address:
      raise ConfigError("distributed.num_processes > 1 needs distributed.coordinator_address "
                      "(host:port of process 0)")
    jax.distributed.initialize(coordinator_address=d.coordinator_address, num_processes=d.num_processes,
                               process_id=d.process_id)
  else:
    return False
  connect_cpu_collectives()
  return True


def connect_cpu_collectives():
  """On CPU, one reduction over every device while the processes are together after their start: Gloo gives a
  group of devices 30 s to connect at its first collective, and a process that compiles the first step that much
  later than another (a loaded machine) would fail it; a group once connected waits as long as it must."""
  if jax.default_backend() != "cpu":
    return
  sharding = jax.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()), ("devices",)), jax.P("devices"))
  ones = jax.make_array_from_process_local_data(sharding, np.ones(jax.local_device_count(), np.int32))
  jax.block_until_ready(jax.jit(jnp.sum)(ones))


def rows_by_process(indices: dict, rows: int, process_of: Callable = lambda device: device.process_index) -> dict:
  """{process: the set of rows its devices hold} of a sharding's `devices_indices_map((rows,))`."""
  held = {}
  for device, index in indices.items():
    held.setdefault(process_of(device), set()).update(range(*index[0].indices(rows)))
  return held


def batch_split_error(held: dict[int, set], rows: int) -> str | None:
  """Why processes holding `held` rows (`rows_by_process`) would not each train on rows of their own, or None: the
  pipeline gives each process batch_size / processes distinct rows, which the mesh axes the batch is split over
  must place on that process alone (a model axis across slices copies the batch to each instead)."""
  if len(held) > 1 and any(len(r) * len(held) != rows for r in held.values()):
    return (f"the batch's rows do not split over the {len(held)} processes (each would hold "
            f"{max(map(len, held.values()))} of {rows}): the mesh axes the batch is split over (partitioning) must "
            "span the processes; put dcn_mesh on data (or expert, with partitioning='expert')")
  return None


def check_batch_split(config):
  """A ConfigError where the config's mesh would not give each process rows of its own (`batch_split_error`)."""
  sharding = batch_sharding(mesh_lib.make_mesh(config), rules_lib.rules(config))
  held = rows_by_process(sharding.devices_indices_map((config.batch_size,)), config.batch_size)
  if error := batch_split_error(held, config.batch_size):
    raise ConfigError(error)


def process_rows(batch: dict) -> dict:
  """This process's share of the rows of a batch that every process built whole (evaluation batches)."""
  n, i = jax.process_count(), jax.process_index()
  rows = len(next(iter(batch.values())))
  if rows % n:
    raise ValueError(f"{rows} rows do not split over {n} processes")
  return {k: v[i * rows // n:(i + 1) * rows // n] for k, v in batch.items()}


def global_batch(local_batch: dict, mesh, axis_rules) -> dict:
  """This process's rows -> global jax.Arrays, rows split as the rules split 'batch' (multi-process safe)."""
  sharding = batch_sharding(mesh, axis_rules)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local_batch.items()}


def row_shards(sharding: jax.sharding.NamedSharding) -> int:
  """How many parts `sharding` splits the rows (axis 0) of an array into."""
  axes = sharding.spec[0] if len(sharding.spec) else None
  axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
  return math.prod(sharding.mesh.shape[a] for a in axes)


def placed(batch: dict, sharding) -> dict:
  """A batch that every process holds whole -> global jax.Arrays split by `sharding` (multi-process safe)."""
  return {k: jax.make_array_from_callback(np.shape(v), sharding, lambda index, v=v: np.asarray(v)[index])
          for k, v in batch.items()}


def gathered(x: jax.Array) -> np.ndarray:
  """The whole value of a global jax.Array, on every process (the rows of the other processes fetched)."""
  return np.asarray(x) if x.is_fully_addressable else multihost_utils.process_allgather(x, tiled=True)


def broadcast_object(value):
  """Process 0's `value` (any picklable object) on every process; the others' `value` is ignored."""
  if jax.process_count() == 1:
    return value
  data = pickle.dumps(value) if jax.process_index() == 0 else b""
  size = int(multihost_utils.broadcast_one_to_all(np.int32(len(data))))
  # Buffers of a power-of-two size, so that a stream of messages compiles a few broadcasts, not one per size.
  buffer = np.zeros(1 << max(size - 1, 255).bit_length(), np.uint8)
  buffer[:len(data)] = np.frombuffer(data, np.uint8)
  return pickle.loads(multihost_utils.broadcast_one_to_all(buffer).tobytes()[:size])


def checked_on_process_0(check: Callable[[], object]):
  """`check()` on process 0 alone (None elsewhere); a UserError or storage fault it raises is raised on every
  process, so that none goes on to wait for the others in a collective."""
  result, error = None, None
  if jax.process_index() == 0:
    try:
      result = check()
    except Exception as e:
      if not isinstance(e, UserError) and io.storage_fault(e) is None:
        raise
      error = e
  error = broadcast_object(error)
  if error is not None:
    raise error
  return result

"""Multi-process runs: starting JAX's distributed runtime, and each process's share of the batch."""

from __future__ import annotations

import jax
import numpy as np

from gshard_mt.errors import ConfigError
from gshard_mt.parallel.shardings import batch_sharding


def initialize_distributed(config) -> bool:
  """Starts JAX's multi-process runtime when the config asks for it; returns whether it did. Call it before
  anything else touches the devices."""
  d = config.distributed
  if d.auto:
    jax.distributed.initialize()
    return True
  if d.num_processes > 1:
    if not d.coordinator_address:
      raise ConfigError("distributed.num_processes > 1 needs distributed.coordinator_address "
                      "(host:port of process 0)")
    jax.distributed.initialize(coordinator_address=d.coordinator_address, num_processes=d.num_processes,
                               process_id=d.process_id)
    return True
  return False


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

"""Multi-process helpers that one process can check: when the runtime starts, each process's rows of a batch,
and local rows made into global arrays."""

import collections

import jax
import numpy as np
import pytest

from gshard_mt.errors import ConfigError
from gshard_mt.parallel import distributed
from gshard_mt.parallel.rules import RULES
from tests.helpers import small_config


def test_one_process_starts_no_runtime_and_several_need_a_coordinator():
  assert distributed.initialize_distributed(small_config()) is False
  with pytest.raises(ConfigError, match="distributed.num_processes > 1 needs distributed.coordinator_address"):
    distributed.initialize_distributed(small_config(**{"distributed.num_processes": 2}))


@pytest.mark.parametrize("index", [0, 1, 2])
def test_process_rows_takes_this_process_share(monkeypatch, index):
  monkeypatch.setattr(jax, "process_count", lambda: 3)
  monkeypatch.setattr(jax, "process_index", lambda: index)
  batch = {"inputs": np.arange(12).reshape(6, 2), "targets": np.arange(6)}
  rows = distributed.process_rows(batch)
  np.testing.assert_array_equal(rows["inputs"], np.arange(12).reshape(6, 2)[2 * index:2 * index + 2])
  np.testing.assert_array_equal(rows["targets"], [2 * index, 2 * index + 1])
  with pytest.raises(ValueError, match="5 rows do not split over 3 processes"):
    distributed.process_rows({"inputs": np.zeros((5, 2))})


def test_global_batch_is_sharded_as_the_rules_split_the_batch():
  mesh = jax.make_mesh((1, 1, 1), ("data", "expert", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 3,
                       devices=jax.devices()[:1])
  local = {"inputs": np.arange(8).reshape(4, 2)}
  out = distributed.global_batch(local, mesh, RULES["expert"])
  np.testing.assert_array_equal(out["inputs"], local["inputs"])
  assert out["inputs"].sharding.spec == jax.sharding.PartitionSpec(("data", "expert"), None)


def test_each_process_must_hold_rows_of_its_own():
  """The pipeline gives each process batch_size / processes distinct rows: a batch split over the processes is
  fine, one copied to each (a model axis across slices) is refused, where JAX would build a batch of half the rows
  whose copies differ."""
  Device = collections.namedtuple("Device", "process_index id")

  def fake(process, lo, hi):  # (a device of `process`, the rows it holds)
    return Device(process, lo), (slice(lo, hi),)

  split = dict(fake(p, lo, lo + 2) for p, lo in ((0, 0), (0, 2), (1, 4), (1, 6)))  # 8 rows, 4 a process
  held = distributed.rows_by_process(split, 8)
  assert held == {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}} and distributed.batch_split_error(held, 8) is None
  copied = dict(fake(p, lo, lo + 4) for p, lo in ((0, 0), (0, 4), (1, 0), (1, 4)))  # every row on both
  assert "do not split over the 2 processes (each would hold 8 of 8)" in distributed.batch_split_error(
      distributed.rows_by_process(copied, 8), 8)
  distributed.check_batch_split(small_config())  # one process: its rows are its own

"""Checkpoints of a small tree: saved every N steps, the last `keep` kept, restored by step or newest first,
an unreadable newest step skipped, and the errors."""

import gc
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.training import checkpoint as checkpoint_lib

# Orbax leaves the reads of a failed restore unawaited; Python reports them when they are collected (the tests
# collect them themselves, under these filters, rather than at exit).
QUIET_FAILED_READS = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning",
                                                "ignore:coroutine .* was never awaited:RuntimeWarning")


def state(step):
  return {"step": jnp.asarray(step, jnp.int32), "w": jnp.full((4, 3), float(step))}


def abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


@pytest.fixture
def three_steps(tmp_path):
  """Steps 1, 2, 3 saved with keep=2: steps 2 and 3 remain."""
  with checkpoint_lib.Checkpoints(tmp_path / "ckpt", every=2, keep=2, async_save=False) as ckpts:
    for step in (1, 2, 3):
      ckpts.save(step, state(step), {"next_index": 10 * step}, force=True)
    ckpts.wait()
  return tmp_path / "ckpt"


def test_keeps_the_last_steps_and_restores_the_newest(three_steps):
  with checkpoint_lib.Checkpoints(three_steps, keep=2) as ckpts:
    assert ckpts.steps() == [2, 3] and ckpts.latest() == 3
    step, restored, data_state = ckpts.restore(abstract(state(0)))
    assert step == 3 and data_state == {"next_index": 30}
    np.testing.assert_array_equal(restored["w"], np.full((4, 3), 3.0))
    step, restored, _ = ckpts.restore(abstract(state(0)), step=2)
    assert step == 2 and int(restored["step"]) == 2
    with pytest.raises(FileNotFoundError, match="no checkpoint for step 1"):
      ckpts.restore(abstract(state(0)), step=1)


def test_should_save_every_n_steps(tmp_path):
  with checkpoint_lib.Checkpoints(tmp_path, every=3) as ckpts:
    assert [s for s in range(1, 10) if ckpts.should_save(s)] == [3, 6, 9]
    assert ckpts.latest() is None and ckpts.restore(abstract(state(0))) is None  # nothing saved yet


def truncate(step_dir):
  for path in (step_dir / "state").rglob("*"):
    if path.is_file():
      path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 3])


@QUIET_FAILED_READS
def test_an_unreadable_newest_step_falls_back_with_a_warning(three_steps, caplog):
  truncate(three_steps / "3")
  with caplog.at_level(logging.WARNING), checkpoint_lib.Checkpoints(three_steps) as ckpts:
    step, restored, data_state = ckpts.restore(abstract(state(0)))
  assert step == 2 and data_state == {"next_index": 20} and float(restored["w"][0, 0]) == 2.0
  assert "ckpt/3 cannot be restored" in caplog.text
  gc.collect()


@QUIET_FAILED_READS
def test_an_unreadable_step_is_set_aside_and_saved_again(three_steps):
  truncate(three_steps / "3")
  with checkpoint_lib.Checkpoints(three_steps, keep=2, async_save=False) as ckpts:
    step, _, _ = ckpts.restore(abstract(state(0)), set_aside=True)
    assert step == 2 and ckpts.steps() == [2]
    ckpts.save(3, state(3), {"next_index": 30}, force=True)  # the step the unreadable one had
    assert ckpts.steps() == [2, 3]
  assert sorted(p.name for p in three_steps.iterdir() if not p.name.startswith(".")) == ["2", "3", "3.unreadable"]
  gc.collect()


@QUIET_FAILED_READS
def test_no_step_restores_onto_another_shape(three_steps):
  wrong = {"step": jax.ShapeDtypeStruct((2,), jnp.int32), "w": jax.ShapeDtypeStruct((5, 3), jnp.float32)}
  with checkpoint_lib.Checkpoints(three_steps) as ckpts, pytest.raises(
      checkpoint_lib.RestoreError, match=r"no checkpoint in .* restores: step 3: \w+: .*; step 2: \w+: "):
    ckpts.restore(wrong, set_aside=True)
  assert sorted(p.name for p in three_steps.iterdir() if not p.name.startswith(".")) == ["2", "3"]  # none moved
  gc.collect()


def test_the_temporaries_of_a_failed_save_are_removed(tmp_path):
  with checkpoint_lib.Checkpoints(tmp_path) as ckpts:
    (tmp_path / "4.orbax-checkpoint-tmp-1234").mkdir()
    (tmp_path / "4.orbax-checkpoint-tmp-1234" / "half").write_text("x")
    ckpts.remove_partial()
  assert list(tmp_path.iterdir()) == []


def test_a_reader_leaves_the_save_in_progress_of_a_training_run_and_creates_nothing(three_steps, tmp_path):
  """eval.py and translate.py read while training saves: their read-only managers restore, but remove no
  temporary directory (a writing manager takes it for a killed save's) and make no folder."""
  in_progress = three_steps / "4.orbax-checkpoint-tmp-1234"
  in_progress.mkdir()
  with checkpoint_lib.Checkpoints(three_steps, read_only=True) as ckpts:
    assert ckpts.steps() == [2, 3] and ckpts.restore(abstract(state(0)))[0] == 3
  assert in_progress.exists()
  with checkpoint_lib.Checkpoints(tmp_path / "missing", read_only=True) as ckpts:
    assert ckpts.steps() == []
  assert not (tmp_path / "missing").exists()
  with checkpoint_lib.Checkpoints(three_steps):  # what the readers did before: Orbax removes it in a thread
    pass
  deadline = time.monotonic() + 30
  while in_progress.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not in_progress.exists()


def test_abstract_with_shardings():
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  out = checkpoint_lib.abstract_with_shardings(abstract(state(0)), {"step": sharding, "w": sharding})
  assert out["w"].shape == (4, 3) and out["w"].dtype == jnp.float32 and out["w"].sharding == sharding

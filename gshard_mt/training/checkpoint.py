"""Orbax checkpoints of the train state and the data-iterator state, saved together, asynchronously.

Restoring takes an abstract target (shapes, dtypes and shardings), so a checkpoint restores onto any mesh. A step
that fails to restore is skipped with a warning for the previous one; training moves it aside to
`<step>.unreadable` (never deleting it) so that it can save that step again. Orbax writes each step to a temporary
directory renamed when complete, so a killed save never appears as a step.
"""

from __future__ import annotations

import logging

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from gshard_mt import io
from gshard_mt.errors import WorkdirError, one_line

log = logging.getLogger(__name__)

FOLDER = "checkpoints"  # in the work directory
UNREADABLE = ".unreadable"


class RestoreError(WorkdirError):
  """Checkpoints exist but none of them restores onto the target (e.g. shapes that do not match the config)."""


class Checkpoints:
  """Saves every `every` steps (and on request), keeps the last `keep`. `read_only` (eval.py, translate.py, which
  may read while training saves): creates nor removes nothing, above all not the temporary directory of a save in
  progress, which a writing manager removes as a killed save's when it opens."""

  def __init__(self, directory: io.PathLike, every: int = 1000, keep: int = 3, async_save: bool = True,
               read_only: bool = False):
    self.directory = io.absolute(directory)
    self.every = every
    # read-only: what Orbax would set itself (with a warning each), and no removal of temporaries
    mode = (dict(read_only=True, save_interval_steps=0, max_to_keep=None, create=False) if read_only else
            dict(max_to_keep=keep, create=True, cleanup_tmp_directories=True))
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(enable_async_checkpointing=async_save, **mode),
        item_names=("state", "data"))

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest(self) -> int | None:
    return max(self.manager.all_steps(), default=None)

  def should_save(self, step: int) -> bool:
    return step % self.every == 0

  def save(self, step: int, state, data_state: dict, force: bool = False) -> bool:
    return self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)), force=force)

  def restore(self, abstract_state, step: int | None = None, set_aside: bool = False):
    """(step, state, data_state) of `step`, else of the newest step that restores; None without checkpoints,
    RestoreError (each step and why, in one line) when none restores. With `set_aside`, the newer steps that failed
    are renamed `<step>.unreadable`."""
    if step is not None and step not in self.steps():
      raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory} (have {self.steps()})")
    failed = []
    for s in [step] if step is not None else list(reversed(self.steps())):
      try:
        out = self.manager.restore(s, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
      except Exception as e:  # noqa: BLE001 - any unreadable step falls back to an older one
        if step is not None:
          raise
        failed.append((s, one_line(e)))
        log.warning("checkpoint %s/%d cannot be restored (%s); trying the previous one", self.directory, s,
                    failed[-1][1])
        continue
      if failed and set_aside:
        self._set_aside([f for f, _ in failed])
      return s, out["state"], out["data"]
    if failed:
      raise RestoreError(f"no checkpoint in {self.directory} restores: "
                         + "; ".join(f"step {s}: {why}" for s, why in failed))
    return None

  def _set_aside(self, steps: list[int]):
    if jax.process_index() == 0:
      for s in steps:
        target = self.directory / f"{s}{UNREADABLE}"
        n = 1
        while target.exists():
          target, n = self.directory / f"{s}{UNREADABLE}.{n}", n + 1
        (self.directory / str(s)).rename(target)
        log.warning("moved the unreadable checkpoint %s/%d aside to %s", self.directory, s, target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("gshard_mt: unreadable checkpoints set aside")
    self.manager.reload()

  def remove_partial(self):
    """Removes the temporary directories of saves that did not complete."""
    if jax.process_index() == 0 and self.directory.exists():
      for tmp in self.directory.glob("*.orbax-checkpoint-tmp*"):
        io.remove_tree(tmp)

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def abstract_with_shardings(abstract_tree, shardings):
  """ShapeDtypeStructs carrying shardings: the restore target for a given mesh."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_tree, shardings)

"""Orbax checkpoints of the train state and the data-iterator state, saved together, asynchronously.

Restoring takes an abstract target (shapes, dtypes and shardings), so a checkpoint restores onto any mesh.
A step directory that fails to restore (a half-written or truncated checkpoint) is skipped with a warning and
the previous one is used. Orbax writes each step to a temporary directory and renames it when complete, so a
killed save never appears as a step.
"""

from __future__ import annotations

import logging
import pathlib

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class RestoreError(RuntimeError):
  """Checkpoints exist but none of them restores onto the target (e.g. shapes that do not match the config)."""


class Checkpoints:
  """Saves every `every` steps (and on request), keeps the last `keep`."""

  def __init__(self, directory: str | pathlib.Path, every: int = 1000, keep: int = 3, async_save: bool = True):
    self.directory = pathlib.Path(directory).resolve()
    self.every = every
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=async_save),
        item_names=("state", "data"))

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest(self) -> int | None:
    steps = self.steps()
    return steps[-1] if steps else None

  def should_save(self, step: int) -> bool:
    return step % self.every == 0

  def save(self, step: int, state, data_state: dict, force: bool = False) -> bool:
    return self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)), force=force)

  def restore(self, abstract_state, step: int | None = None):
    """(step, state, data_state) of `step`, else of the newest step that restores; None when there is no
    checkpoint at all, RestoreError when there are some but none restores."""
    candidates = [step] if step is not None else list(reversed(self.steps()))
    if step is not None and step not in self.steps():
      raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory} (have {self.steps()})")
    error = None
    for s in candidates:
      try:
        out = self.manager.restore(s, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        return s, out["state"], out["data"]
      except Exception as e:  # noqa: BLE001 - any unreadable step falls back to an older one
        if step is not None:
          raise
        error = e
        log.warning("checkpoint %s/%d cannot be restored (%s: %s); trying the previous one", self.directory, s,
                    type(e).__name__, str(e).splitlines()[0][:200])
    if error is not None:
      raise RestoreError(f"no checkpoint in {self.directory} restores: {type(error).__name__}: "
                         f"{str(error).splitlines()[0][:300]}")
    return None

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

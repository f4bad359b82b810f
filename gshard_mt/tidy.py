"""A start that fails (refused, interrupted) leaves its directory as it found it: `left_as_found` removes the local
folders the start made and left empty, the directory itself too when the start made it."""

from __future__ import annotations

import contextlib
import os
import pathlib

from gshard_mt import io


@contextlib.contextmanager
def left_as_found(directory: io.PathLike):
  """Runs the block; when it raises, removes the local folders it made and left empty: under `directory`,
  `directory` itself and the parents made for it. The files it wrote stay (a prepared corpus, which the next start
  reuses)."""
  if not io.is_local(directory):  # object storage has no empty folders to leave
    yield
    return
  made = pathlib.Path(os.path.abspath(directory))
  found = made if made.exists() else next(p for p in made.parents if p.exists())
  before = {root for root, _, _ in os.walk(made)}
  try:
    yield
  except BaseException:
    empty = [pathlib.Path(root) for root, _, _ in os.walk(made, topdown=False) if root not in before]
    for folder in [*empty, *(p for p in made.parents if found in p.parents)]:  # deepest first
      with contextlib.suppress(OSError):  # not empty (what the block wrote), or gone
        folder.rmdir()
    raise

"""Writing files and directories so that a killed run never leaves half of one under the final name."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil


def write_atomically(path: str | pathlib.Path, data: str | bytes) -> None:
  """Writes `data` to a temporary name beside `path`, then renames it over `path` (atomic on one filesystem)."""
  path = pathlib.Path(path)
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  if isinstance(data, bytes):
    tmp.write_bytes(data)
  else:
    tmp.write_text(data)
  os.replace(tmp, path)


@contextlib.contextmanager
def directory_atomically(path: str | pathlib.Path):
  """Yields a temporary directory beside `path` to fill; on success it replaces `path` whole, on an error it is
  removed and `path` is left as it was."""
  path = pathlib.Path(path)
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True)
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  old = path.with_name(f".{path.name}.old{os.getpid()}")
  if path.exists():
    os.replace(path, old)
  os.replace(tmp, path)
  shutil.rmtree(old, ignore_errors=True)

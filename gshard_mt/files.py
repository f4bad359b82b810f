"""Writing a file so that a killed run never leaves half of it under the final name."""

from __future__ import annotations

import os
import pathlib


def write_atomically(path: str | pathlib.Path, data: str | bytes) -> None:
  """Writes `data` to a temporary name beside `path`, then renames it over `path` (atomic on one filesystem)."""
  path = pathlib.Path(path)
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  if isinstance(data, bytes):
    tmp.write_bytes(data)
  else:
    tmp.write_text(data)
  os.replace(tmp, path)

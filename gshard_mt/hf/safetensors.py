"""The safetensors format with numpy alone (no torch, no safetensors package): a file is an 8-byte little-endian
header length, a JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}
(offsets relative to the data that follows it), then the tensors' little-endian bytes, back to back.

A checkpoint is a file, or a directory with `model.safetensors`, or shards named by `model.safetensors.index.json`'s
weight_map (`model-00001-of-00002.safetensors`, as transformers writes them). `open` reads only the headers and
checks them against the files' sizes; tensors are then np.memmap views, read one at a time. `write_file` and `write`
stream tensors to a temporary name, then rename. Local files only (memory maps).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import pathlib
import shutil
import struct
from collections.abc import Iterable, Iterator, Mapping

import ml_dtypes
import numpy as np

from gshard_mt import io
from gshard_mt.errors import UserError, WorkdirError

DTYPES = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
          "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype("<i8"), "I32": np.dtype("<i4"),
          "I16": np.dtype("<i2"), "I8": np.dtype("i1"), "U8": np.dtype("u1"), "BOOL": np.dtype(np.bool_)}
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
MAX_HEADER = 100_000_000  # the safetensors library's own limit: a larger length is a corrupt file
ALIGN = 8  # the header is padded with spaces so that the data starts 8-byte aligned, as the library writes it


@dataclasses.dataclass(frozen=True)
class Entry:
  """One tensor: its file, dtype code ('F32'), shape, and absolute byte range [start, start + nbytes)."""
  file: pathlib.Path
  dtype: str
  shape: tuple[int, ...]
  start: int
  nbytes: int


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """An opened checkpoint: its tensors' entries in file order (shards in turn) and the first file's __metadata__."""
  path: pathlib.Path
  entries: dict[str, Entry]
  metadata: dict[str, str]

  def names(self) -> list[str]:
    return list(self.entries)

  def tensor(self, name: str) -> np.ndarray:
    """The tensor `name`, a read-only memory map of its bytes; a name not in the checkpoint is a WorkdirError."""
    if name not in self.entries:
      raise WorkdirError(f"{self.path}: no tensor {name} ({len(self.entries)} tensors)")
    return _load(self.entries[name])

  def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
    """(name, array) of every tensor in file order, each mapped only when reached."""
    for name, entry in self.entries.items():
      yield name, _load(entry)


def _load(entry: Entry) -> np.ndarray:
  dtype = DTYPES[entry.dtype]
  if entry.nbytes == 0:  # mmap cannot map zero bytes
    return np.zeros(entry.shape, dtype)
  return np.memmap(entry.file, dtype, mode="r", offset=entry.start, shape=(math.prod(entry.shape),)).reshape(
    entry.shape)


def open(path: io.PathLike) -> Checkpoint:
  """The checkpoint at `path`: a .safetensors file, or a directory holding model.safetensors (looked for first, as
  transformers does) or the index of its shards. Headers only are read; a missing file or a bad header is a
  one-line WorkdirError naming it."""
  path = pathlib.Path(path)
  if path.is_dir():
    if not (path / SINGLE).is_file():
      if (path / INDEX).is_file():
        return _open_shards(path, path / INDEX)
      raise WorkdirError(f"{path}: neither {SINGLE} nor {INDEX} is there")
    path = path / SINGLE
  elif not path.is_file():
    raise WorkdirError(f"{path}: no such safetensors file or directory")
  metadata, entries = read_header(path)
  return Checkpoint(path, entries, metadata)


def _open_shards(directory: pathlib.Path, index: pathlib.Path) -> Checkpoint:
  try:
    weight_map = json.loads(index.read_text())["weight_map"]
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
      raise TypeError("weight_map is not {tensor: file}")
  except (ValueError, KeyError, TypeError) as e:
    raise WorkdirError(f"{index}: not a safetensors index ({type(e).__name__}: {e})") from None
  entries: dict[str, Entry] = {}
  metadata: dict[str, str] | None = None
  for shard in dict.fromkeys(weight_map.values()):
    file = directory / shard
    if not file.is_file():
      raise WorkdirError(f"{index}: its shard {shard} is missing")
    header_metadata, found = read_header(file)
    metadata = header_metadata if metadata is None else metadata
    listed = {name for name, s in weight_map.items() if s == shard}
    if listed - set(found):
      raise WorkdirError(f"{index}: lists {sorted(listed - set(found))[0]} in {shard}, which does not hold it")
    entries.update((name, entry) for name, entry in found.items() if name in listed)
  return Checkpoint(directory, entries, metadata or {})


def read_header(file: pathlib.Path) -> tuple[dict[str, str], dict[str, Entry]]:
  """(__metadata__, {name: Entry} in data order) of one file, checked: the header's length and JSON, each
  tensor's dtype, shape and offsets, and that the tensors tile the data exactly (as the safetensors library
  requires) within the file's size."""
  size = file.stat().st_size
  with file.open("rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise WorkdirError(f"{file}: truncated safetensors header ({size} bytes, shorter than its 8-byte length)")
    (length,) = struct.unpack("<Q", head)
    if length > MAX_HEADER or 8 + length > size:
      raise WorkdirError(f"{file}: corrupt or truncated safetensors header (length {length}, file {size} bytes)")
    text = f.read(length)
  try:
    header = json.loads(text)
    if not isinstance(header, dict):
      raise ValueError("not a JSON object")
  except ValueError as e:  # UnicodeDecodeError and JSONDecodeError too
    raise WorkdirError(f"{file}: corrupt safetensors header ({e})") from None
  metadata = header.pop("__metadata__", None) or {}
  entries = {name: _entry(file, name, spec, 8 + length) for name, spec in header.items()}
  entries = dict(sorted(entries.items(), key=lambda item: item[1].start))
  end = 8 + length
  for name, entry in entries.items():
    if entry.start != end:
      raise WorkdirError(f"{file}: tensor {name}'s bytes start at {entry.start - 8 - length}, not at the previous "
                         f"tensor's end {end - 8 - length}")
    end += entry.nbytes
    if end > size:
      raise WorkdirError(f"{file}: tensor {name}'s bytes overrun the file (end at byte {end}, file {size} bytes)")
  if end != size:
    raise WorkdirError(f"{file}: {size - end} bytes after the last tensor's end")
  return metadata, entries


def _entry(file: pathlib.Path, name: str, spec, data_start: int) -> Entry:
  """An Entry from one header item, or a WorkdirError naming the file, the tensor and what is wrong."""
  if not isinstance(spec, dict) or spec.get("dtype") not in DTYPES:
    got = spec.get("dtype") if isinstance(spec, dict) else spec
    raise WorkdirError(f"{file}: tensor {name} has unknown dtype {got!r} (known: {', '.join(DTYPES)})")
  shape, offsets = spec.get("shape"), spec.get("data_offsets")
  if not (isinstance(shape, list) and all(isinstance(n, int) and n >= 0 for n in shape)
          and isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(n, int) for n in offsets)
          and 0 <= offsets[0] <= offsets[1]):
    raise WorkdirError(f"{file}: tensor {name} has a bad shape {shape!r} or data_offsets {offsets!r}")
  nbytes = math.prod(shape) * DTYPES[spec["dtype"]].itemsize
  if offsets[1] - offsets[0] != nbytes:
    raise WorkdirError(f"{file}: tensor {name} of shape {shape} {spec['dtype']} needs {nbytes} bytes, its "
                       f"data_offsets {offsets} hold {offsets[1] - offsets[0]}")
  return Entry(file, spec["dtype"], tuple(shape), data_start + offsets[0], nbytes)


def dtype_code(dtype: np.dtype, name: str) -> str:
  """'F32' for float32 ...; another dtype is a UserError naming the tensor."""
  for code, known in DTYPES.items():
    if np.dtype(dtype).newbyteorder("<") == known:
      return code
  raise UserError(f"tensor {name}: dtype {np.dtype(dtype)} has no safetensors code (known: {', '.join(DTYPES)})")


def _temporary(target: pathlib.Path, kind: str) -> pathlib.Path:
  return target.with_name(f".{target.name}.{kind}{os.getpid()}")


@contextlib.contextmanager
def _removed_after(*files: pathlib.Path):
  try:
    yield
  finally:
    for file in files:
      file.unlink(missing_ok=True)


def write_file(file: io.PathLike, tensors: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]],
               metadata: Mapping[str, str] | None = None) -> int:
  """Writes `tensors` (in their order) to one .safetensors file, each array's bytes streamed to a temporary data
  file as it comes, then the header and the data under a temporary name, renamed to `file`. Returns its size."""
  file = pathlib.Path(file)
  items = tensors.items() if isinstance(tensors, Mapping) else tensors
  if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
    raise UserError(f"{file}: safetensors metadata must map strings to strings, got {dict(metadata)!r}")
  data, tmp = _temporary(file, "data"), _temporary(file, "tmp")
  header: dict[str, dict] = {} if metadata is None else {"__metadata__": dict(metadata)}
  with _removed_after(data, tmp):
    with data.open("wb") as out:
      offset = 0
      for name, array in items:
        array = np.asarray(array)
        code = dtype_code(array.dtype, name)
        if name in header:
          raise UserError(f"{file}: tensor {name} given twice")
        raw = np.ascontiguousarray(array, DTYPES[code]).reshape(-1).view(np.uint8)
        out.write(raw.data)
        header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + raw.size]}
        offset += raw.size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % ALIGN)
    with tmp.open("wb") as out, data.open("rb") as source:
      out.write(struct.pack("<Q", len(text)) + text)
      shutil.copyfileobj(source, out, 1 << 24)
    tmp.replace(file)
  return file.stat().st_size


def write(directory: io.PathLike, tensors: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]],
          metadata: Mapping[str, str] | None = None, max_shard_bytes: int | None = None) -> list[pathlib.Path]:
  """Writes `tensors` into `directory` as transformers' save_pretrained does: model.safetensors, or with more than
  `max_shard_bytes` of tensors shards model-0000k-of-0000n.safetensors (a new shard when the next tensor would not
  fit; a tensor larger than the limit alone in its own, placed when reached, as huggingface_hub splits them) and
  model.safetensors.index.json ({"metadata": {"total_parameters", "total_size"}, "weight_map"}), written last;
  the checkpoint files of an earlier write that these do not replace are removed. Holds one shard's tensors at a
  time. Returns the files written."""
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  items = tensors.items() if isinstance(tensors, Mapping) else tensors
  limit = math.inf if max_shard_bytes is None else max_shard_bytes
  parts: list[pathlib.Path] = []
  totals = [0, 0]  # bytes, parameters

  def flush(shard: list[tuple[str, np.ndarray]]):
    parts.append(_temporary(directory / f"part{len(parts)}", "tmp"))
    write_file(parts[-1], shard, metadata)

  current: list[tuple[str, np.ndarray]] = []
  size = 0
  try:
    for name, array in items:
      array = np.asarray(array)
      totals[0] += array.nbytes
      totals[1] += array.size
      if array.nbytes > limit:
        flush([(name, array)])
        continue
      if current and size + array.nbytes > limit:
        flush(current)
        current, size = [], 0
      current.append((name, array))
      size += array.nbytes
    if current or not parts:
      flush(current)
  except BaseException:
    for part in parts:
      part.unlink(missing_ok=True)
    raise
  return _name_shards(directory, parts, *totals)


def _name_shards(directory: pathlib.Path, parts: list[pathlib.Path], total_size: int,
                 total_parameters: int) -> list[pathlib.Path]:
  """Renames the written parts to their final names, writes the index of more than one, and removes the files of
  an earlier checkpoint there."""
  names = [SINGLE] if len(parts) == 1 else [f"model-{k:05d}-of-{len(parts):05d}.safetensors"
                                            for k in range(1, len(parts) + 1)]
  written = names + [INDEX] * (len(parts) > 1)
  stale = [f for f in [directory / SINGLE, directory / INDEX, *directory.glob("model-?????-of-?????.safetensors")]
           if f.name not in written and f.exists()]
  weight_map = {}
  for part, name in zip(parts, names):
    weight_map.update(dict.fromkeys(read_header(part)[1], name))
    part.replace(directory / name)
  if len(parts) > 1:
    index = {"metadata": {"total_parameters": total_parameters, "total_size": total_size}, "weight_map": weight_map}
    io.write_atomically(directory / INDEX, json.dumps(index, indent=2, sort_keys=True) + "\n")
  for file in stale:
    file.unlink()
  return [directory / name for name in written]

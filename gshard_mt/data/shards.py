"""A prepared corpus on disk: flat arrays per split that training memory-maps, and the manifest that describes them.

A prepared directory (`spm-<V>-<key>/` under `data.prepared_dir` or `<workdir>/tokenizer`, written once by
`gshard_mt.data.prepare`) holds
  manifest.json             each split's streams in order with their pair counts, the token type, the info;
                            written last: a directory without it is incomplete
  spm.model                 the tokenizer
  <split>.<array>.bin       raw little-endian arrays (ARRAYS), pairs stream by stream, streams sorted by name:
    lang                       int32 [n]     stream index of each pair
    src_offsets, src_tokens    pair i's source is src_tokens[src_offsets[i]:src_offsets[i + 1]] (int64 [n + 1];
                               uint16 tokens when the vocabulary fits in 16 bits, else int32)
    tgt_offsets, tgt_tokens    the same for the English side
    src_text_offsets, src_text, tgt_text_offsets, tgt_text   the UTF-8 text of both sides, the same way
NumPy memory-maps local files only: a directory in object storage is copied to a local folder first (`local_copy`).
Pages are read when a batch touches them, so a process's memory does not grow with the corpus.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Sequence

import numpy as np

from gshard_mt import io
from gshard_mt.data import packing
from gshard_mt.data.corpus import Pairs

MANIFEST = "manifest.json"
MODEL = "spm.model"
# Arrays per split and their types ('tokens': the manifest's token type).
ARRAYS = {"lang": "int32", "src_offsets": "int64", "src_tokens": "tokens", "tgt_offsets": "int64",
          "tgt_tokens": "tokens", "src_text_offsets": "int64", "src_text": "uint8", "tgt_text_offsets": "int64",
          "tgt_text": "uint8"}


def token_dtype(vocab_size: int) -> str:
  return "uint16" if vocab_size <= 1 << 16 else "int32"


def array_path(directory: pathlib.Path, split: str, name: str) -> pathlib.Path:
  return directory / f"{split}.{name}.bin"


def read_array(path: os.PathLike, dtype) -> np.ndarray:
  """A memory map of a raw array (an empty array for an empty file, which cannot be mapped)."""
  return np.memmap(path, dtype, mode="r") if os.path.getsize(path) else np.zeros(0, dtype)


class Lines(Sequence):
  """Lines of UTF-8 text stored back to back: line k is data[offsets[k]:offsets[k + 1]], decoded when read."""

  def __init__(self, data: np.ndarray, offsets: np.ndarray):
    self.data, self.offsets = data, offsets

  def __len__(self):
    return len(self.offsets) - 1

  def __getitem__(self, k):
    if isinstance(k, slice):
      start, stop, step = k.indices(len(self))
      if step != 1:
        return [self[i] for i in range(start, stop, step)]
      ends = np.asarray(self.offsets[start:max(stop, start) + 1]).tolist()  # one read for the whole range
      blob = self.data[ends[0]:ends[-1]].tobytes()
      return [blob[a - ends[0]:b - ends[0]].decode("utf-8") for a, b in zip(ends, ends[1:])]
    if not -len(self) <= k < len(self):
      raise IndexError(k)
    k %= len(self)
    return self.data[self.offsets[k]:self.offsets[k + 1]].tobytes().decode("utf-8")


class RaggedWriter:
  """Appends sequences to a values file and their end offsets to an offsets file (which starts with 0)."""

  def __init__(self, values: pathlib.Path, offsets: pathlib.Path):
    self.values, self.offsets, self.end = open(values, "wb"), open(offsets, "wb"), 0
    self.offsets.write(np.zeros(1, np.int64).tobytes())

  def add(self, values: np.ndarray, lengths: np.ndarray):
    """values: the sequences back to back; lengths: int [k], one per sequence."""
    self.values.write(np.ascontiguousarray(values).tobytes())
    self.offsets.write((self.end + np.cumsum(lengths, dtype=np.int64)).tobytes())
    self.end += int(np.sum(lengths))

  def close(self):
    self.values.close()
    self.offsets.close()


def read_manifest(directory: io.PathLike) -> dict | None:
  """The manifest of a complete prepared directory, or None."""
  path = io.path(directory) / MANIFEST
  return json.loads(path.read_text()) if path.exists() else None


def open_tokens(directory: pathlib.Path, manifest: dict, split: str) -> packing.TokenizedSplit:
  """A split's tokens, memory-mapped from a local prepared directory."""
  a = {k: read_array(array_path(directory, split, k), manifest["token_dtype"] if t == "tokens" else t)
       for k, t in ARRAYS.items() if "text" not in k}
  return packing.TokenizedSplit([s for s, _ in manifest["splits"][split]], a["lang"], a["src_tokens"],
                                a["src_offsets"], a["tgt_tokens"], a["tgt_offsets"])


def open_text(directory: pathlib.Path, manifest: dict, split: str) -> dict[str, Pairs]:
  """A split's text {stream: Pairs of `Lines`}, memory-mapped from a local prepared directory."""
  a = {k: read_array(array_path(directory, split, k), t) for k, t in ARRAYS.items() if "text" in k}
  text, start = {}, 0
  for stream, n in manifest["splits"][split]:  # [[stream, pairs], ...] in order
    lines = [Lines(a[f"{side}_text"], a[f"{side}_text_offsets"][start:start + n + 1]) for side in ("src", "tgt")]
    text[stream] = Pairs(*lines, manifest["origins"].get(stream, ""))
    start += n
  return text


def local_path(directory: io.PathLike) -> pathlib.Path:
  """Where a prepared directory is memory-mapped from: itself when local, else a folder under the system's
  temporary folder ($TMPDIR), one per host."""
  if io.is_local(directory):
    return pathlib.Path(os.fspath(directory))
  return pathlib.Path(tempfile.gettempdir()) / "gshard_mt-prepared" / io.path(directory).name


def local_copy(directory: io.PathLike) -> pathlib.Path:
  """`local_path(directory)`, holding the complete prepared directory: a copy is made once per host, file by file
  with the manifest last (a copy cut short is made again)."""
  local = local_path(directory)
  if io.is_local(directory) or (local / MANIFEST).exists():
    return local
  local.mkdir(parents=True, exist_ok=True)
  for source in sorted(io.path(directory).iterdir(), key=lambda p: (p.name == MANIFEST, p.name)):
    tmp = local / f".{source.name}.tmp{os.getpid()}"
    try:
      with source.open("rb") as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 24)
      tmp.replace(local / source.name)
    finally:
      tmp.unlink(missing_ok=True)
  return local

"""Tokenized splits as flat arrays, and the two batch layouts: packed rows (training), padded rows (evaluation).

A batch is a dict of int32 [B, L] arrays: `inputs`, `targets`, and for each their `_segmentation` (1, 2, ... for
the pairs packed into a row, 0 for padding) and `_position` (position within its own pair). Attention is masked
to equal segment ids, so packed pairs never see each other.
"""

from __future__ import annotations

import dataclasses
import io
import pathlib

import numpy as np

from gshard_mt.data.tokenizer import EOS_ID
from gshard_mt.io import write_atomically

FIELDS = ("inputs", "targets")
BATCH_KEYS = tuple(f"{f}{suffix}" for f in FIELDS for suffix in ("", "_segmentation", "_position"))
SOURCE_KEYS = BATCH_KEYS[:3]  # what encoding (and so decoding) reads


@dataclasses.dataclass
class TokenizedSplit:
  """n pairs as flat token arrays: pair i's source is src_tokens[src_offsets[i]:src_offsets[i+1]]."""

  languages: list[str]
  lang: np.ndarray  # int32 [n], index into languages
  src_tokens: np.ndarray
  src_offsets: np.ndarray  # int64 [n + 1]
  tgt_tokens: np.ndarray
  tgt_offsets: np.ndarray

  def __len__(self):
    return len(self.lang)

  @property
  def src_len(self):
    return np.diff(self.src_offsets)

  @property
  def tgt_len(self):
    return np.diff(self.tgt_offsets)

  @classmethod
  def from_lists(cls, languages, lang, src: list[list[int]], tgt: list[list[int]]):
    def flat(seqs):
      lengths = np.array([len(s) for s in seqs], np.int64)
      tokens = np.fromiter((t for s in seqs for t in s), np.int32, count=int(lengths.sum()))
      return tokens, np.concatenate([[0], np.cumsum(lengths)])
    return cls(list(languages), np.asarray(lang, np.int32), *flat(src), *flat(tgt))

  def save(self, path: pathlib.Path):
    arrays = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "languages"}
    buffer = io.BytesIO()
    np.savez(buffer, languages=np.array(self.languages), **arrays)
    write_atomically(path, buffer.getvalue())

  @classmethod
  def load(cls, path: pathlib.Path):
    with np.load(path) as z:
      return cls(languages=z["languages"].tolist(), **{k: z[k] for k in z.files if k != "languages"})


def _empty_batch(rows: int, length: int) -> dict[str, np.ndarray]:
  return {f"{f}{suffix}": np.zeros((rows, length), np.int32) for f in FIELDS
          for suffix in ("", "_segmentation", "_position")}


def _scatter(batch, field, tokens, offsets, ids, dest_start, segment, length):
  """Copies pair `ids`' tokens of one side to flat positions dest_start (vectorised)."""
  lens = (offsets[ids + 1] - offsets[ids]).astype(np.int64)
  lens = np.minimum(lens, length)  # evaluation rows truncate over-long sources
  within = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
  dest = np.repeat(dest_start, lens) + within
  batch[field].reshape(-1)[dest] = tokens[np.repeat(offsets[ids], lens) + within]
  batch[f"{field}_segmentation"].reshape(-1)[dest] = np.repeat(segment, lens)
  batch[f"{field}_position"].reshape(-1)[dest] = within


def pack(split: TokenizedSplit, candidates: np.ndarray, length: int, max_misses: int = 4):
  """Packs row r from its own candidate pairs candidates[r] (each side <= length), in order, skipping pairs that
  do not fit, until `max_misses` in a row did not fit; returns (batch [R, length], real tokens).

  Each row depends only on its own candidates, so any process can build any subset of a batch's rows. Skipping
  favours short pairs a little (their languages gain a few percent of the sampling rate); a small `max_misses`
  bounds that bias at some cost in packing efficiency.
  """
  rows = candidates.shape[0]
  src_len = split.src_len[candidates].tolist()
  tgt_len = split.tgt_len[candidates].tolist()
  placed, real = [], 0
  for r in range(rows):
    src_fill = tgt_fill = count = misses = 0
    for k, (ls, lt) in enumerate(zip(src_len[r], tgt_len[r])):
      if src_fill + ls <= length and tgt_fill + lt <= length:
        count += 1
        placed.append((r, k, src_fill, tgt_fill, count))
        src_fill, tgt_fill, misses = src_fill + ls, tgt_fill + lt, 0
      else:
        misses += 1
        if misses >= max_misses:
          break
    real += src_fill + tgt_fill
  batch = _empty_batch(rows, length)
  if placed:
    r, k, so, to, seg = (np.array(c, np.int64) for c in zip(*placed))
    ids = candidates[r, k]
    _scatter(batch, "inputs", split.src_tokens, split.src_offsets, ids, r * length + so, seg, length)
    _scatter(batch, "targets", split.tgt_tokens, split.tgt_offsets, ids, r * length + to, seg, length)
  return batch, real


def pad(split: TokenizedSplit, ids: np.ndarray, rows: int, length: int) -> dict[str, np.ndarray]:
  """One pair per row, padded to `length` (sources truncated, keeping EOS); rows beyond len(ids) are empty.

  Adds `index` int32 [rows]: the pair id of each row, -1 for padding rows.
  """
  if len(ids) > rows:
    raise ValueError(f"{len(ids)} pairs do not fit in {rows} rows")
  batch = _empty_batch(rows, length)
  ids = np.asarray(ids, np.int64)
  starts = np.arange(len(ids), dtype=np.int64) * length
  ones = np.ones(len(ids), np.int64)
  _scatter(batch, "inputs", split.src_tokens, split.src_offsets, ids, starts, ones, length)
  _scatter(batch, "targets", split.tgt_tokens, split.tgt_offsets, ids, starts, ones, length)
  for field in FIELDS:  # a truncated sequence still ends with EOS
    full = (batch[f"{field}_segmentation"][: len(ids), -1] > 0)
    batch[field][: len(ids)][full, -1] = EOS_ID
  batch["index"] = np.full((rows,), -1, np.int32)
  batch["index"][: len(ids)] = ids
  return batch

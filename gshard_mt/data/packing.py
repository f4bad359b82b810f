"""Tokenized splits as flat arrays, and the two batch layouts: packed rows (training), padded rows (evaluation).

A batch is a dict of int32 arrays: `inputs` [B, Ls], `targets` [B, Lt], and for each their `_segmentation`
(1, 2, ... for the pairs packed into a row, 0 for padding) and `_position` (position within its own pair).
Attention is masked to equal segment ids, so packed pairs never see each other.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gshard_mt.batch import FIELDS


@dataclasses.dataclass
class TokenizedSplit:
  """n pairs as flat token arrays: pair i's source is src_tokens[src_offsets[i]:src_offsets[i+1]] (in memory, or
  memory-mapped from a prepared corpus: `gshard_mt.data.shards`)."""

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


def _empty_batch(rows: int, lengths: tuple[int, int]) -> dict[str, np.ndarray]:
  """Zeros: each key of FIELDS[k] (and its segmentation and position) int32 [rows, lengths[k]]."""
  return {f"{f}{suffix}": np.zeros((rows, n), np.int32) for f, n in zip(FIELDS, lengths)
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


def _first_fit(src_len: list[int], tgt_len: list[int], order: list[int], rows: int, lengths: tuple[int, int]):
  """Row of each pair (list [n]) when pairs are placed in `order`, each into the first row with room on both
  sides; None if some pair finds no room."""
  src_room, tgt_room = [lengths[0]] * rows, [lengths[1]] * rows
  row = [0] * len(src_len)
  for k in order:
    s, t = src_len[k], tgt_len[k]
    for r in range(rows):
      if src_room[r] >= s and tgt_room[r] >= t:
        row[k], src_room[r], tgt_room[r] = r, src_room[r] - s, tgt_room[r] - t
        break
    else:
      return None
  return row


def fill_rows(src_len: np.ndarray, tgt_len: np.ndarray, rows: int, lengths: tuple[int, int]) -> np.ndarray:
  """Packs the longest prefix of a stream of pairs into `rows` rows of lengths (source, target) tokens.

  src_len, tgt_len: int [n], the pairs' lengths in sampled order, each within its side's length. Returns row: int64
  [k], the row of each of the first k pairs. Taking a prefix whatever the lengths keeps the language rates and the
  length distribution; within it, pairs are placed first-fit decreasing (largest share of a row on either side
  first), which wastes far less room than sampled order. k is the longest prefix within the total room that
  first-fit decreasing places, tried from there down.
  """
  src_len, tgt_len = np.asarray(src_len, np.int64), np.asarray(tgt_len, np.int64)
  k = int(min(np.searchsorted(np.cumsum(src_len), rows * lengths[0], side="right"),
              np.searchsorted(np.cumsum(tgt_len), rows * lengths[1], side="right")))
  size = np.maximum(src_len[:k] * lengths[1], tgt_len[:k] * lengths[0])
  decreasing = np.argsort(-size, kind="stable").tolist()
  src_len, tgt_len = src_len[:k].tolist(), tgt_len[:k].tolist()
  while (row := _first_fit(src_len, tgt_len, [i for i in decreasing if i < k], rows, lengths)) is None:
    k -= 1
  return np.array(row[:k], np.int64)


def pack(split: TokenizedSplit, ids: np.ndarray, row: np.ndarray, rows: int, lengths: tuple[int, int]):
  """Lays out pairs `ids` int [n] in the rows `row` int [n] (0 <= row < rows; each row's pairs within lengths =
  (source, target) tokens), segment ids 1, 2, ... in the order given; returns (batch, real tokens): `inputs*` int32
  [rows, lengths[0]], `targets*` int32 [rows, lengths[1]]."""
  ids, row = np.asarray(ids, np.int64), np.asarray(row, np.int64)
  order = np.argsort(row, kind="stable")
  ids, row = ids[order], row[order]
  first = np.searchsorted(row, row)  # index of the row's first pair
  segment = np.arange(len(row)) - first + 1
  batch = _empty_batch(rows, lengths)
  real = 0
  for field, tokens, offsets, length in zip(FIELDS, (split.src_tokens, split.tgt_tokens),
                                            (split.src_offsets, split.tgt_offsets), lengths):
    lens = offsets[ids + 1] - offsets[ids]
    if (np.bincount(row, lens, rows) > length).any():
      raise ValueError(f"the pairs given for a row have more than {length} {field} tokens")
    end = np.cumsum(lens)
    start = row * length + (end - lens) - (end - lens)[first]  # tokens of earlier pairs in the same row
    _scatter(batch, field, tokens, offsets, ids, start, segment, length)
    real += int(lens.sum())
  return batch, real


def pad(split: TokenizedSplit, ids: np.ndarray, rows: int, length: int,
        target_length: int | None = None) -> dict[str, np.ndarray]:
  """One pair per row, padded to `length` tokens (the target side to `target_length`, default `length`; truncated,
  keeping the last token, EOS); rows beyond len(ids) are empty. Adds `index` int32 [rows]: each row's pair id, -1
  for padding rows."""
  if len(ids) > rows:
    raise ValueError(f"{len(ids)} pairs do not fit in {rows} rows")
  lengths = (length, target_length or length)
  batch = _empty_batch(rows, lengths)
  ids = np.asarray(ids, np.int64)
  ones = np.ones(len(ids), np.int64)
  sides = zip(FIELDS, (split.src_tokens, split.tgt_tokens), (split.src_offsets, split.tgt_offsets), lengths)
  for field, tokens, offsets, length in sides:
    starts = np.arange(len(ids), dtype=np.int64) * length
    _scatter(batch, field, tokens, offsets, ids, starts, ones, length)
    full = batch[f"{field}_segmentation"][: len(ids), -1] > 0  # a truncated sequence still ends as it did (EOS)
    batch[field][: len(ids)][full, -1] = tokens[offsets[ids[full] + 1] - 1]
  batch["index"] = np.full((rows,), -1, np.int32)
  batch["index"][: len(ids)] = ids
  return batch

"""The input pipeline: a prepared corpus (memory-mapped tokens and tokenizer) -> temperature-sampled packed batches.

Training batch `i` is a pure function of (seed, i): a run resumed at step i sees the batches an uninterrupted run
would, and the iterator state is {'seed', 'next_index'}. Each process of a multi-host run builds only its rows of
that global batch. A background thread puts batches on the devices ahead of the step (`prefetch`: the host stays
ahead of the devices, as in Pathways' asynchronous dispatch). The corpus is prepared once (`gshard_mt.data.prepare`)
and memory-mapped, so a batch pages in only what it reads; the sampler's index (`Eligible`) is kept beside it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import json
import logging
import os
import pathlib
from collections.abc import Callable, Iterator

import numpy as np

from gshard_mt import config as config_lib
from gshard_mt import io
from gshard_mt.data import corpus as corpus_lib
from gshard_mt.data import packing, sampling, shards, tokenizer_files
from gshard_mt.data import prepare as prepare_lib
from gshard_mt.data import tokenizer as tokenizer_lib
from gshard_mt.errors import DataError

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Eligible:
  """The training pairs that fit the row lengths, what the sampler draws from: `ids` int64 [m], stream by stream,
  each stream's in corpus order; `counts` int64 [streams]; `mean_lengths` float64 [2, streams], the mean source and
  target tokens of each stream's; `shortest`, the fewest tokens on either side of any; `filtered`, pairs left out."""

  ids: np.ndarray
  counts: np.ndarray
  mean_lengths: np.ndarray
  shortest: int
  filtered: int


def eligible(split: packing.TokenizedSplit, lengths: tuple[int, int], out: Callable | None = None,
             chunk: int = 1 << 20) -> Eligible:
  """The pairs of `split` within lengths = (source, target) tokens, read `chunk` pairs at a time (a memory-mapped
  split is never read whole, nor held); `out(m)` gives the int64 array the ids are written to."""
  L = len(split.languages)

  def chunks():  # (first pair, fits bool [k], lang [k], (source, target) lengths [2, k]) per chunk
    for lo in range(0, len(split), chunk):
      hi = min(lo + chunk, len(split))
      lens = np.stack([np.diff(o[lo:hi + 1]) for o in (split.src_offsets, split.tgt_offsets)])
      yield lo, (lens[0] <= lengths[0]) & (lens[1] <= lengths[1]), np.asarray(split.lang[lo:hi]), lens

  counts, sums, shortest, filtered = np.zeros(L, np.int64), np.zeros((2, L)), [], 0
  for _, fits, lang, lens in chunks():
    counts += np.bincount(lang[fits], minlength=L)
    sums += [np.bincount(lang[fits], n[fits], L) for n in lens]
    shortest += [int(lens[:, fits].min())] if fits.any() else []
    filtered += int((~fits).sum())
  ids = (out or functools.partial(np.empty, dtype=np.int64))(int(counts.sum()))
  cursor = np.cumsum(counts) - counts
  for lo, fits, lang, _ in chunks():
    mine = np.flatnonzero(fits)
    mine = mine[np.argsort(lang[mine], kind="stable")]
    group = lang[mine]
    ids[cursor[group] + np.arange(len(mine)) - np.searchsorted(group, group)] = lo + mine
    cursor += np.bincount(group, minlength=L)
  return Eligible(ids, counts, sums / np.maximum(counts, 1), min(shortest, default=0), filtered)


def cached_eligible(directory: pathlib.Path, split: packing.TokenizedSplit, lengths: tuple[int, int]) -> Eligible:
  """`eligible` of a prepared training split: computed once per row lengths and kept in its local directory, the
  ids memory-mapped (computed in memory where the directory cannot be written)."""
  name = f"train.eligible-{lengths[0]}x{lengths[1]}"
  ids_path, info_path = directory / f"{name}.bin", directory / f"{name}.json"
  if not info_path.exists():
    tmp = directory / f".{name}.tmp{os.getpid()}"
    try:
      index = eligible(split, lengths, lambda m: np.memmap(tmp, np.int64, "w+", shape=m) if m else np.zeros(0, int))
      if len(index.ids):
        index.ids.flush()
      else:  # an empty file, which cannot be mapped
        tmp.write_bytes(b"")
      tmp.replace(ids_path)
      info = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in vars(index).items() if k != "ids"}
      io.write_atomically(info_path, json.dumps(info))  # last: its presence says the ids are complete
    except OSError as e:
      log.warning("cannot keep the sampler's index in %s (%s): computed in memory", directory, e)
      tmp.unlink(missing_ok=True)
      return eligible(split, lengths)
  info = json.loads(info_path.read_text())
  return Eligible(shards.read_array(ids_path, np.int64), np.array(info["counts"], np.int64),
                  np.array(info["mean_lengths"]), info["shortest"], info["filtered"])


class TrainBatches:
  """Packed training batches by index: `batch(i)` is deterministic; iteration continues from `next_index`.

  The global batch's rows are packed in windows of `window_rows` rows, each from its own stream of sampled pairs
  (seeded by seed, i and the window), so a process packs only the windows that overlap its rows and the global
  batch is the same whatever the number of processes. `lengths` is (source, target) tokens per row. Windows of 16
  rows come within 0.01 of the efficiency of 32-row ones at configs/base.py, and pack faster.
  """

  def __init__(self, split: packing.TokenizedSplit, rates: dict[str, float], rows: int, lengths: tuple[int, int],
               seed: int, process_index: int = 0, process_count: int = 1, window_rows: int = 16,
               index: Eligible | None = None):
    if rows % process_count:
      raise ValueError(f"batch_size={rows} does not divide over {process_count} processes")
    self.split, self.lengths, self.seed, self.window_rows = split, tuple(lengths), seed, window_rows
    self.global_rows = rows
    self.rows = rows // process_count
    self.first_row = process_index * self.rows
    index = index or eligible(split, lengths)  # `index`: the same, kept beside a prepared split
    self.filtered, self.eligible, self.counts = index.filtered, index.ids, index.counts
    self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
    self.rates = np.array([rates.get(lang, 0.0) if n else 0.0 for lang, n in zip(split.languages, self.counts)])
    if self.rates.sum() <= 0:
      raise ValueError(f"no training pair fits {lengths[0]} source and {lengths[1]} target tokens "
                       "(data.max_length, data.max_target_length)")
    self.rates = self.rates / self.rates.sum()
    self.cumulative_rates = np.cumsum(self.rates)
    self.cumulative_rates[np.flatnonzero(self.rates)[-1]:] = np.inf  # a draw above a rounded sum: no empty stream
    self.mean_lengths = list(index.mean_lengths)  # float [languages] per side
    # pairs per stream: more than a window's rows can hold, so that a window always fills before its stream ends
    self.per_window = window_rows * max(lengths) // max(index.shortest, 1) + 1
    # pairs a row holds on average, with a margin: how much of a stream `_head` reads first
    self.pairs_per_row = 1.5 * min(n / (self.rates @ mean) for n, mean in zip(lengths, self.mean_lengths))
    self.next_index = self.real_tokens = self.slots = 0

  def _stream(self, index: int, window: int) -> np.ndarray:
    """Positions in `eligible` int64 [per_window] of the pairs sampled at the rates for a window of batch `index`:
    (seed, index, window) seed them, nothing else."""
    rng = np.random.default_rng([self.seed, index, window])
    langs = np.searchsorted(self.cumulative_rates, rng.random(self.per_window), side="right")
    offset = (rng.random(self.per_window) * self.counts[langs]).astype(np.int64)
    return self.starts[langs] + offset

  def _head(self, stream: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, source lengths, target lengths) of the head of a window's stream: enough pairs that the longest prefix
    within the room of `rows` rows ends inside it (or the whole stream). The stream is drawn long enough for the
    shortest pairs; reading only its head keeps a batch's reads of a memory-mapped corpus near what it packs."""
    room, n = rows * np.asarray(self.lengths), int(rows * self.pairs_per_row) + 8
    while True:
      ids = self.eligible[stream[:n]]
      src_len, tgt_len = (offsets[ids + 1] - offsets[ids] for offsets in (self.split.src_offsets,
                                                                          self.split.tgt_offsets))
      if n >= len(stream) or src_len.sum() > room[0] or tgt_len.sum() > room[1]:
        return ids, src_len, tgt_len
      n *= 2

  def batch(self, index: int) -> dict[str, np.ndarray]:
    """This process's rows of global batch `index`: a pure function of (seed, index) and the rows."""
    W, end = self.window_rows, self.first_row + self.rows
    ids, rows = [], []
    for first in range(self.first_row // W * W, end, W):  # the windows that overlap this process's rows
      size = min(W, self.global_rows - first)
      head, src_len, tgt_len = self._head(self._stream(index, first // W), size)
      row = first + packing.fill_rows(src_len, tgt_len, size, self.lengths)
      mine = (row >= self.first_row) & (row < end)
      ids.append(head[: len(row)][mine])
      rows.append(row[mine] - self.first_row)
    batch, real = packing.pack(self.split, np.concatenate(ids), np.concatenate(rows), self.rows, self.lengths)
    self.real_tokens += real
    self.slots += self.rows * sum(self.lengths)
    return batch

  @property
  def packing_efficiency(self) -> float:
    """Real tokens / slots over the batches made so far (both sides)."""
    return self.real_tokens / max(self.slots, 1)

  @property
  def efficiency_bound(self) -> float:
    """The packing efficiency that no packing of pairs sampled at the rates exceeds on average: the side whose
    expected tokens take the larger share of its row length fills its rows at most (configs/base.py: sources are
    1.6x as long as targets, so equal row lengths leave over a third of the target slots empty)."""
    src, tgt = (self.rates @ m for m in self.mean_lengths)
    return (src + tgt) / (max(src / self.lengths[0], tgt / self.lengths[1]) * sum(self.lengths))

  def __iter__(self) -> Iterator[tuple[int, dict]]:
    return self

  def __next__(self) -> tuple[int, dict]:
    index = self.next_index
    self.next_index += 1
    return index, self.batch(index)

  def state(self, next_index: int) -> dict:
    """What a checkpoint keeps to resume at batch `next_index` (not `self.next_index`: prefetching reads ahead)."""
    return {"seed": self.seed, "next_index": next_index}

  def set_state(self, state: dict):
    if state["seed"] != self.seed:
      raise ValueError(f"data state was saved with seed {state['seed']}, this run uses {self.seed}")
    self.next_index = int(state["next_index"])


def eval_batches(split: packing.TokenizedSplit, rows: int, length: int, ids,
                 target_length: int | None = None) -> Iterator[dict]:
  """The pairs `ids` int [n], one per row, in fixed [rows, length] batches (targets [rows, target_length], default
  `length`); the last batch is padded with empty rows (`index` -1)."""
  for start in range(0, len(ids), rows):
    yield packing.pad(split, ids[start:start + rows], rows, length, target_length)


def language_ids(split: packing.TokenizedSplit, lang: str) -> np.ndarray:
  """Pair ids of one language, in corpus order."""
  return np.flatnonzero(split.lang == split.languages.index(lang))


def prefetch(iterator: Iterator, size: int = 2, put: Callable = lambda x: x) -> Iterator:
  """`put(next(iterator))` (e.g. a device_put) run in order in a background thread, `size` items ahead; its errors
  are raised here. Close the returned generator (`.close()`) when done with it: that joins the thread."""
  done = object()

  def produce():
    item = next(iterator, done)
    return item if item is done else put(item)

  pool = concurrent.futures.ThreadPoolExecutor(1)
  try:
    ahead = collections.deque(pool.submit(produce) for _ in range(max(size, 1)))
    while (item := ahead.popleft().result()) is not done:
      ahead.append(pool.submit(produce))
      yield item
  finally:  # what has not started is dropped; waiting for the rest leaves no thread inside a device transfer
    pool.shutdown(cancel_futures=True)


@dataclasses.dataclass
class Data:
  """What training and evaluation need from the data, memory-mapped from `directory` (the local copy)."""

  tokenizer: tokenizer_lib.Tokenizer
  text: dict[str, corpus_lib.Corpus]  # split -> stream -> pairs (`shards.Lines`, read when indexed)
  tokens: dict[str, packing.TokenizedSplit]
  rates: dict[str, float]
  info: dict
  directory: pathlib.Path

  def train_batches(self, config, process_index=0, process_count=1) -> TrainBatches:
    lengths = config_lib.row_lengths(config)
    return TrainBatches(self.tokens["train"], self.rates, config.batch_size, lengths, config.data.seed,
                        process_index, process_count, index=cached_eligible(self.directory, self.tokens["train"],
                                                                            lengths))


def load(config, workdir: io.PathLike, prepared: str | None = None) -> Data:
  """The config's data: its prepared corpus (the run's, `prepare.for_run`), memory-mapped, and the sampling rates.
  `prepared` names a corpus that another process has prepared; without it, the corpus is prepared here when
  missing."""
  root = prepare_lib.root(config.data, workdir)
  directory = root / prepared if prepared else prepare_lib.for_run(config.data, workdir)
  manifest = shards.read_manifest(directory)
  if manifest is None:
    raise DataError(f"{directory}: prepared data not found; process 0 prepared it there, so this process must see "
                    f"the same folder (data.prepared_dir, or a work directory shared by all hosts)")
  local = shards.local_copy(directory)
  text = {split: shards.open_text(local, manifest, split) for split in corpus_lib.SPLITS}
  tokens = {split: shards.open_tokens(local, manifest, split) for split in corpus_lib.SPLITS}
  counts = dict(manifest["splits"]["train"])  # stream -> pairs
  rates = sampling.temperature_rates(counts, config.data.temperature)
  info = {"empty_lines_skipped": manifest["info"]["empty_lines_skipped"], "languages": len(counts),
          "train_pairs": sum(counts.values()), "dev_pairs": len(tokens["dev"]), "test_pairs": len(tokens["test"])}
  log.info("data: %s (%s)", info, directory)
  return Data(tokenizer_files.load(directory), text, tokens, rates, info, local)

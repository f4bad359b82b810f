"""The input pipeline: corpus -> cached tokenizer and token arrays -> temperature-sampled packed batches.

Training batch `i` is a pure function of (seed, i): resuming at step i sees exactly the batches an
uninterrupted run would have seen, and the iterator state is just {'seed', 'next_index'}. Each process of a
multi-host run builds only its own rows of that same global batch. A background thread prepares batches and puts
them on the devices ahead of the step that needs them (the host stays ahead of the devices, as in Pathways'
asynchronous dispatch).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from collections.abc import Callable, Iterator

import numpy as np

from gshard_mt import io
from gshard_mt.data import corpus as corpus_lib
from gshard_mt.data import packing, sampling
from gshard_mt.data import tokenizer as tokenizer_lib

log = logging.getLogger(__name__)


def tokenize(split: corpus_lib.Corpus, tok: tokenizer_lib.Tokenizer) -> packing.TokenizedSplit:
  languages = sorted(split)
  lang, src, tgt = [], [], []
  for i, name in enumerate(languages):
    src += tok.encode(split[name].src, name)
    tgt += tok.encode(split[name].tgt)
    lang += [i] * len(split[name])
  return packing.TokenizedSplit.from_lists(languages, lang, src, tgt)


def tokenize_cached(split: corpus_lib.Corpus, tok: tokenizer_lib.Tokenizer, name: str) -> packing.TokenizedSplit:
  """Tokenizes once per (tokenizer, content); later runs load the arrays from beside the tokenizer."""
  path = tok.path.with_name(f"{tok.path.stem}-{name}-{corpus_lib.fingerprint(split)}.npz")
  if path.exists():
    return packing.TokenizedSplit.load(path)
  data = tokenize(split, tok)
  data.save(path)
  return data


class TrainBatches:
  """Packed training batches by index: `batch(i)` is deterministic; iteration continues from `next_index`.

  The global batch's rows are packed in windows of `window_rows` rows, each from its own stream of sampled pairs
  (seeded by seed, i and the window), so a process packs only the windows that overlap its rows and the global
  batch is the same whatever the number of processes. `lengths` is (source, target) tokens per row. Windows of 16
  rows come within 0.01 of the efficiency of 32-row ones at configs/base.py, and pack faster.
  """

  def __init__(self, split: packing.TokenizedSplit, rates: dict[str, float], rows: int, lengths: tuple[int, int],
               seed: int, process_index: int = 0, process_count: int = 1, window_rows: int = 16):
    if rows % process_count:
      raise ValueError(f"batch_size={rows} does not divide over {process_count} processes")
    self.split, self.lengths, self.seed, self.window_rows = split, tuple(lengths), seed, window_rows
    self.src_len, self.tgt_len = split.src_len, split.tgt_len
    self.global_rows = rows
    self.rows = rows // process_count
    self.first_row = process_index * self.rows
    fits = (self.src_len <= lengths[0]) & (self.tgt_len <= lengths[1])
    by_lang = [np.flatnonzero(fits & (split.lang == i)) for i in range(len(split.languages))]
    self.filtered = int((~fits).sum())
    self.eligible = np.concatenate(by_lang)
    self.counts = np.array([len(ids) for ids in by_lang])
    self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
    self.rates = np.array([rates.get(lang, 0.0) if n else 0.0 for lang, n in zip(split.languages, self.counts)])
    if self.rates.sum() <= 0:
      raise ValueError(f"no training pair fits {lengths[0]} source and {lengths[1]} target tokens "
                       "(data.max_length, data.max_target_length)")
    self.rates = self.rates / self.rates.sum()
    self.cumulative_rates = np.cumsum(self.rates)
    lang = split.lang[self.eligible]
    self.mean_lengths = [np.bincount(lang, n[self.eligible], len(self.counts)) / np.maximum(self.counts, 1)
                         for n in (self.src_len, self.tgt_len)]  # float [languages] per side
    # pairs per stream: more than a window's rows can hold, so that a window always fills before its stream ends
    shortest = min(int(n[self.eligible].min()) for n in (self.src_len, self.tgt_len))
    self.per_window = window_rows * max(lengths) // max(shortest, 1) + 1
    self.next_index = 0
    self.real_tokens = 0
    self.slots = 0

  def _stream(self, index: int, window: int) -> np.ndarray:
    """Pair ids int64 [per_window] sampled at the rates for a window of batch `index`: (seed, index, window) seed
    them, nothing else."""
    rng = np.random.default_rng([self.seed, index, window])
    langs = np.searchsorted(self.cumulative_rates, rng.random(self.per_window), side="right")
    langs = langs.clip(0, len(self.rates) - 1)
    offset = (rng.random(self.per_window) * self.counts[langs]).astype(np.int64)
    return self.eligible[self.starts[langs] + offset]

  def batch(self, index: int) -> dict[str, np.ndarray]:
    """This process's rows of global batch `index`: a pure function of (seed, index) and the rows."""
    W, end = self.window_rows, self.first_row + self.rows
    ids, rows = [], []
    for first in range(self.first_row // W * W, end, W):  # the windows that overlap this process's rows
      stream = self._stream(index, first // W)
      row = first + packing.fill_rows(self.src_len[stream], self.tgt_len[stream], min(W, self.global_rows - first),
                                      self.lengths)
      mine = (row >= self.first_row) & (row < end)
      ids.append(stream[: len(row)][mine])
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

  def get_state(self) -> dict:
    return {"seed": self.seed, "next_index": self.next_index}

  def set_state(self, state: dict):
    if state["seed"] != self.seed:
      raise ValueError(f"data state was saved with seed {state['seed']}, this run uses {self.seed}")
    self.next_index = int(state["next_index"])


def eval_batches(split: packing.TokenizedSplit, rows: int, length: int, ids=None) -> Iterator[dict]:
  """The pairs `ids` (default: all, in order), one per row, in fixed [rows, length] batches; the last batch is
  padded with empty rows (`index` -1)."""
  ids = np.arange(len(split)) if ids is None else np.asarray(ids)
  for start in range(0, len(ids), rows):
    yield packing.pad(split, ids[start:start + rows], rows, length)


def language_ids(split: packing.TokenizedSplit, lang: str) -> np.ndarray:
  """Pair ids of one language, in corpus order."""
  return np.flatnonzero(split.lang == split.languages.index(lang))


def prefetch(iterator: Iterator, size: int = 2, put: Callable = lambda x: x) -> Iterator:
  """Runs `put(next(iterator))` (e.g. a device_put) in a background thread, `size` items ahead.

  Close the returned generator (`.close()`) when done with it: that stops and joins the thread.
  """
  q: queue.Queue = queue.Queue(maxsize=max(size, 1))
  done = object()
  stop = threading.Event()

  def produce():
    try:
      for item in iterator:
        value = put(item)  # once: retries below only wait for room in the queue
        while not stop.is_set():
          try:
            q.put(value, timeout=0.1)
            break
          except queue.Full:
            continue
        if stop.is_set():
          return
    except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
      q.put(e)
    q.put(done)

  thread = threading.Thread(target=produce, daemon=True)
  thread.start()
  try:
    while (item := q.get()) is not done:
      if isinstance(item, BaseException):
        raise item
      yield item
  finally:  # on close(): stop the producer and wait for it, so no thread is left inside a device transfer
    stop.set()
    thread.join(timeout=60)


@dataclasses.dataclass
class Data:
  """Everything the training and evaluation programs need from the data."""

  tokenizer: tokenizer_lib.Tokenizer
  text: dict[str, corpus_lib.Corpus]  # split -> language -> pairs
  tokens: dict[str, packing.TokenizedSplit]
  rates: dict[str, float]
  info: dict

  def train_batches(self, config, process_index=0, process_count=1) -> TrainBatches:
    return TrainBatches(self.tokens["train"], self.rates, config.batch_size, packing.row_lengths(config),
                        config.data.seed, process_index, process_count)


def load(config, workdir: io.PathLike) -> Data:
  """Reads the configured corpus, trains or loads the tokenizer, tokenizes (cached) and computes the rates."""
  text, info = corpus_lib.load_corpus(config.data)
  tok = tokenizer_lib.train_or_load(text["train"], workdir, config.data.vocab_size, config.data.source_tags,
                                    config.data.character_coverage)
  tokens = {name: tokenize_cached(text[name], tok, name) for name in corpus_lib.SPLITS}
  counts = {lang: len(pairs) for lang, pairs in text["train"].items()}
  rates = sampling.temperature_rates(counts, config.data.temperature)
  info = {**info, "languages": len(counts), "train_pairs": sum(counts.values()),
          "dev_pairs": len(tokens["dev"]), "test_pairs": len(tokens["test"])}
  log.info("data: %s", info)
  return Data(tok, text, tokens, rates, info)

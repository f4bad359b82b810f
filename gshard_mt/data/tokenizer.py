"""Tokenizers and the ids the model, decoding, packing and the loss read of them (`SpecialIds`): one source of truth.

Two kinds, loaded from disk by `gshard_mt.data.tokenizer_files.load`:
- `SentencePieceTokenizer`: a shared vocabulary for all languages, trained on (a sample of) the training split once,
  when the corpus is prepared (`gshard_mt.data.prepare`). Fixed ids: PAD = 0, EOS = 1, UNK = 2 (no BOS: the decoder
  starts from PAD, as in Flax's wmt example). With `data.source_tags`, each source language gets a reserved piece
  `<xx>` that is prepended to its sentences. Every text comes back out unchanged (but U+2581, SentencePiece's own word
  boundary, which comes back as a space): no normalisation, digits split one by one (so numbers are never rare), and
  characters outside the vocabulary fall back to their UTF-8 bytes (256 byte pieces), so UNK never appears.
- `gshard_mt.data.nllb.NllbTokenizer`: NLLB-200's, as transformers' NllbTokenizer.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator
from io import BytesIO

import numpy as np
import sentencepiece as spm

from gshard_mt import io
from gshard_mt.data.corpus import TARGET, Pairs, language_of
from gshard_mt.errors import DataError

log = logging.getLogger(__name__)

# Lossless: raw text in and out (no NFKC: it would turn "…" into "..." and references keep "…").
TRAINER_OPTIONS = {"byte_fallback": True, "split_digits": True, "normalization_rule_name": "identity",
                   "remove_extra_whitespaces": False}
MAX_SENTENCES = 1_000_000  # sentences the model is trained on, at most (a sample of bigger corpora)
# SentencePiece's pace: Tatoeba-112's 142,206 sentences into 4,000 pieces in 10 s on 2 quiet cores (2026-11-27)
SENTENCES_PER_CORE_S = 7_000


@dataclasses.dataclass(frozen=True)
class SpecialIds:
  """The ids of a tokenizer that the model, decoding, packing and the loss read."""

  pad: int
  eos: int  # ends every sequence; decoding stops there
  unk: int
  start: int  # the decoder's first input (shift_right's at each pair's start, decoding's step 0)
  never: tuple[int, ...]  # ids decoding never outputs


SENTENCEPIECE_IDS = SpecialIds(pad=0, eos=1, unk=2, start=0, never=(0, 2))  # PAD starts; bytes leave no UNK


class Tokenizer:
  """What both kinds share: sequences are `prefix + pieces + [EOS]`, the prefix of a source `source_prefix(lang)`,
  of a target `forced(lang)` (the tokens decoding forces first). A kind defines `ids`, `vocab_size`, `pieces`
  (texts -> ids without prefix or EOS), `source_prefix`, `forced` and `decode`."""

  ids: SpecialIds
  path: io.epath.Path
  tags_every_source: bool  # whether every source starts with its language's token (else: with data.source_tags)

  def decoding(self) -> dict:
    """What decoding reads of the tokenizer (`decode.Translator`'s ids and forced): the target is English."""
    return {"ids": self.ids, "forced": self.forced(TARGET)}

  def prefix(self, lang: str | None, target: bool) -> list[int]:
    if lang is None:
      return []
    return list(self.forced(lang)) if target else self.source_prefix(lang)

  def encode(self, texts: list[str], lang: str | None = None, *, target: bool = False) -> list[list[int]]:
    """Ids of each text followed by EOS, preceded by the source (or, `target`, the target) language's prefix."""
    prefix = self.prefix(lang, target)
    return [prefix + ids + [self.ids.eos] for ids in self.pieces(texts)]

  def encode_flat(self, texts: list[str], lang: str | None, dtype, *, target: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    """`encode`'s ids of all texts back to back, as (tokens [sum of lengths] of `dtype`, lengths int64 [n])."""
    prefix = self.prefix(lang, target)
    ids = self.pieces(texts, threads=1)  # one thread: the preparation runs one process per core
    body = np.fromiter(map(len, ids), np.int64, len(ids))
    lengths = body + 1 + len(prefix)
    tokens = np.empty(int(lengths.sum()), dtype)
    ends = np.cumsum(lengths)
    fill = np.ones(len(tokens), bool)
    fill[ends - 1] = False
    tokens[ends - 1] = self.ids.eos
    for k, token in enumerate(prefix):
      fill[ends - lengths + k] = False
      tokens[ends - lengths + k] = token
    tokens[fill] = np.fromiter(itertools.chain.from_iterable(ids), dtype, int(body.sum()))
    return tokens, lengths

  def until_eos(self, ids) -> list[int]:
    """ids as ints, cut at the first EOS."""
    ids = [int(i) for i in np.asarray(ids).tolist()]
    return ids[: ids.index(self.ids.eos)] if self.ids.eos in ids else ids


def one_line(text: str) -> str:
  """A decoded text as one line: the line breaks byte pieces can make become spaces, so a file of translations keeps
  one per line (eval's hypotheses, translate.py)."""
  return text.replace("\r", " ").replace("\n", " ")


class SentencePieceTokenizer(Tokenizer):
  """Encodes and decodes with this project's SentencePiece model (`train`); knows the source-language tags."""

  ids = SENTENCEPIECE_IDS
  tags_every_source = False

  def __init__(self, model_path: io.PathLike):
    self.path = io.path(model_path)
    # from bytes: the model may be in object storage, which SentencePiece cannot open
    self.sp = spm.SentencePieceProcessor(model_proto=self.path.read_bytes())

  @property
  def vocab_size(self) -> int:
    return self.sp.get_piece_size()

  def tag_id(self, stream: str) -> int | None:
    """Id of the reserved `<lang>` piece of a stream's language, or None when the model has no such tag."""
    i = self.sp.piece_to_id(f"<{language_of(stream)}>")
    return None if i == self.ids.unk else i

  def source_prefix(self, lang: str) -> list[int]:
    """The `<lang>` tag when the model has one (data.source_tags), else nothing."""
    tag = self.tag_id(lang)
    return [] if tag is None else [tag]

  def forced(self, lang: str) -> tuple[int, ...]:
    return ()  # the target language is always English: nothing to force

  def piece(self, i: int) -> str:
    return self.sp.id_to_piece(i)

  def pieces(self, texts: list[str], threads: int | None = None) -> list[list[int]]:
    return self.sp.encode(texts, num_threads=threads)

  def decode(self, ids) -> str:
    """Text of one id sequence, cut at the first EOS; PAD and tags are dropped; one line (`one_line`)."""
    return one_line(self.sp.decode([i for i in self.until_eos(ids) if i != self.ids.pad and not self.sp.is_control(i)]))


def tag_pieces(streams: list[str], source_tags: bool) -> list[str]:
  """The reserved `<lang>` pieces of the streams' languages (none without data.source_tags)."""
  return [f"<{lang}>" for lang in sorted({language_of(s) for s in streams})] if source_tags else []


def train(sentences: Iterator[str], vocab_size: int, tags: list[str], character_coverage: float = 0.9995) -> bytes:
  """A unigram SentencePiece model (its bytes) of `sentences` with the fixed ids and `tags`; SentencePiece samples
  MAX_SENTENCES of them when given more."""
  model = BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences, model_writer=model, model_type="unigram",
        vocab_size=vocab_size, character_coverage=character_coverage, pad_id=SENTENCEPIECE_IDS.pad,
        eos_id=SENTENCEPIECE_IDS.eos, unk_id=SENTENCEPIECE_IDS.unk, bos_id=-1, control_symbols=tags,
        input_sentence_size=MAX_SENTENCES, shuffle_input_sentence=True, num_threads=os.cpu_count() or 1,
        minloglevel=2, **TRAINER_OPTIONS)
  except RuntimeError as e:
    if "Vocabulary size too high" in str(e):
      raise DataError(f"data.vocab_size={vocab_size} is too large for this training data: {e}") from None
    if "smaller than required_chars" in str(e):
      raise DataError(f"data.vocab_size={vocab_size} is smaller than the characters this data needs; raise it or "
                      f"lower data.character_coverage={character_coverage}: {e}") from None
    raise
  return model.getvalue()


def training_sentences(train: list[Pairs]):
  """The tokenizer's training sentences, stream by stream: every pair's source and English lines (a line break
  inside a sentence splits it), or those of a sample of pairs when there are more than tokenizer.MAX_SENTENCES."""
  n = sum(map(len, train))
  chosen = np.arange(n)
  if 2 * n > MAX_SENTENCES:
    chosen = np.sort(np.random.default_rng(0).choice(n, MAX_SENTENCES // 2, replace=False))
  start = 0
  for pairs in train:
    for i in (chosen[(chosen >= start) & (chosen < start + len(pairs))] - start).tolist():
      yield from pairs.src[i].splitlines()
      yield from pairs.tgt[i].splitlines()
    start += len(pairs)


def seconds_to_train(sentences: int) -> float:
  """About how long `train` takes on this machine's cores for `sentences` (SENTENCES_PER_CORE_S's pace), 1 s at
  least (starting its process takes about that)."""
  return max(1.0, sentences / (SENTENCES_PER_CORE_S * (os.cpu_count() or 1)))


POLL_S = 0.2  # how often train_apart looks for a Ctrl-C while the tokenizer trains


def train_apart(sentences: Callable[[], Iterator[str]], count: int, vocab_size: int, *args) -> bytes:
  """`train(sentences(), vocab_size, *args)` in a process of its own (spawned: the caller may be a threaded JAX
  program), so that Ctrl-C stops it at once: SentencePiece's trainer is native code that sees no signal until it
  ends. The child ignores Ctrl-C and is killed when this process is interrupted; `sentences` (picklable) makes its
  `count` sentences there. It says first what it does and about how long it takes."""
  # Ctrl-C only marks an Event, which the short waits below read: a KeyboardInterrupt raised by the default
  # handler inside the pool's start or a wait could be lost there (seen under load), a mark cannot.
  interrupted = threading.Event()
  main = threading.current_thread() is threading.main_thread()  # where Python runs signal handlers
  previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set()) if main else None
  try:
    log.info("data: training the tokenizer (SentencePiece, %d pieces, %d sentences: about %.0f s here; Ctrl-C "
             "stops it)", vocab_size, count, seconds_to_train(count))
    context = multiprocessing.get_context("spawn")
    with context.Pool(1, initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN)) as pool:
      result = pool.apply_async(_train_from, (sentences, vocab_size, *args))
      while not (result.ready() or interrupted.is_set()):
        result.wait(POLL_S)
    if interrupted.is_set():  # during the training or the pool's closing
      raise KeyboardInterrupt
    return result.get()  # ready: kept once the pool has closed
  finally:
    if main:
      signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


def _train_from(sentences: Callable[[], Iterator[str]], *args) -> bytes:
  return train(sentences(), *args)

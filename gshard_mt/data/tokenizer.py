"""A shared SentencePiece vocabulary for all languages, trained on the training split and cached.

Fixed ids: PAD = 0, EOS = 1, UNK = 2 (no BOS: the decoder starts from PAD, as in Flax's wmt example). With
`data.source_tags`, each source language gets a reserved piece `<xx>` that is prepended to its sentences.

Every text comes back out unchanged: no normalisation, digits split one by one (so numbers are never rare), and
characters outside the vocabulary fall back to their UTF-8 bytes (256 byte pieces), so UNK never appears.
"""

from __future__ import annotations

import hashlib
import os
from io import BytesIO

import numpy as np
import sentencepiece as spm

from gshard_mt import io
from gshard_mt.data.corpus import Corpus, language_of
from gshard_mt.errors import DataError

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
# Lossless: raw text in and out (no NFKC: it would turn "…" into "..." and references keep "…").
TRAINER_OPTIONS = {"byte_fallback": True, "split_digits": True, "normalization_rule_name": "identity",
                   "remove_extra_whitespaces": False}


class Tokenizer:
  """Encodes and decodes with a SentencePiece model; knows the source-language tags."""

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
    return None if i == UNK_ID else i

  def encode(self, texts: list[str], lang: str | None = None) -> list[list[int]]:
    """Ids of each text followed by EOS; preceded by the `<lang>` tag when given and known."""
    tag = [] if lang is None or self.tag_id(lang) is None else [self.tag_id(lang)]
    return [tag + ids + [EOS_ID] for ids in self.sp.encode(texts)]

  def decode(self, ids) -> str:
    """Text of one id sequence, cut at the first EOS; PAD and tags are dropped."""
    ids = [int(i) for i in np.asarray(ids).tolist()]
    if EOS_ID in ids:
      ids = ids[: ids.index(EOS_ID)]
    return self.sp.decode([i for i in ids if i != PAD_ID and not self.sp.is_control(i)])


def train_or_load(train: Corpus, workdir: io.PathLike, vocab_size: int, source_tags: bool,
                  character_coverage: float = 0.9995, max_sentences: int = 1_000_000) -> Tokenizer:
  """The cached tokenizer for this training data and settings, training it first when missing."""
  languages = sorted(train)
  tags = [f"<{lang}>" for lang in sorted({language_of(s) for s in languages})] if source_tags else []
  text = "".join(s + "\n" + t + "\n" for lang in languages for s, t in zip(train[lang].src, train[lang].tgt))
  settings = f"{vocab_size}|{character_coverage}|{tags}|{TRAINER_OPTIONS}|"
  key = hashlib.sha256(settings.encode() + text.encode()).hexdigest()[:12]
  model_path = io.path(workdir) / "tokenizer" / f"spm-{vocab_size}-{key}.model"
  if model_path.exists():
    return Tokenizer(model_path)
  model_path.parent.mkdir(parents=True, exist_ok=True)
  model = BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines()), model_writer=model, model_type="unigram",
        vocab_size=vocab_size, character_coverage=character_coverage, pad_id=PAD_ID, eos_id=EOS_ID,
        unk_id=UNK_ID, bos_id=-1, control_symbols=tags, input_sentence_size=max_sentences,
        shuffle_input_sentence=True, num_threads=os.cpu_count() or 1, minloglevel=2, **TRAINER_OPTIONS)
  except RuntimeError as e:
    if "Vocabulary size too high" in str(e):
      raise DataError(f"data.vocab_size={vocab_size} is too large for this training data: {e}") from None
    if "smaller than required_chars" in str(e):
      raise DataError(f"data.vocab_size={vocab_size} is smaller than the characters this data needs; raise it or "
                      f"lower data.character_coverage={character_coverage}: {e}") from None
    raise
  io.write_atomically(model_path, model.getvalue())
  return Tokenizer(model_path)

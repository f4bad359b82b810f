"""NLLB-200's tokenizer, identical to transformers' NllbTokenizer (non-legacy) on a directory its save_pretrained
wrote (sentencepiece.bpe.model, tokenizer_config.json).

Fairseq's ids: `<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3 (SentencePiece's unknown piece), every other piece its
SentencePiece id + 1, then the added tokens: the language codes (FAIRSEQ_LANGUAGE_CODES) and `<mask>`, at the ids
tokenizer_config.json's added_tokens_decoder gives (transformers reads them there; without it: the codes after the
pieces, `<mask>` last, as NLLB-200's checkpoints have them). A source is `[src_code] pieces </s>`, a target
`[tgt_code] pieces </s>`; the decoder starts from `</s>` and its first output is forced to the target's code.
Added tokens written in a text are those tokens (transformers splits the text on them). Decoding drops every added
token (skip_special_tokens) and UNK, and joins the pieces as transformers does.
"""

from __future__ import annotations

import difflib
import json
import re

import sentencepiece as spm

from gshard_mt import io
from gshard_mt.data.corpus import language_of
from gshard_mt.data.nllb_languages import FAIRSEQ_LANGUAGE_CODES, USUAL_CODES
from gshard_mt.data.tokenizer import SpecialIds, Tokenizer, one_line
from gshard_mt.errors import DataError

MODEL = "sentencepiece.bpe.model"
CONFIG = "tokenizer_config.json"
FILES = (MODEL, CONFIG, "special_tokens_map.json")  # what a prepared corpus copies of an NLLB tokenizer
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0-3
IDS = SpecialIds(pad=1, eos=2, unk=3, start=2, never=())  # nothing masked: as transformers' generate
WORD = "\u2581"  # SentencePiece's word boundary
# transformers' clean_up_tokenization (where tokenizer_config.json asks for it)
CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
            (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def nllb_code(lang: str) -> str:
  """The NLLB code of a language or stream name: an NLLB code itself ('fra_Latn'), a corpus code with one NLLB code
  ('fra' -> 'fra_Latn'), or one of USUAL_CODES ('cmn' -> 'zho_Hans'); else a DataError naming the near ones."""
  lang = language_of(lang)  # a stream name: its language (NLLB codes have no dot)
  if lang in FAIRSEQ_LANGUAGE_CODES:
    return lang
  if lang in USUAL_CODES:
    return USUAL_CODES[lang]
  found = [code for code in FAIRSEQ_LANGUAGE_CODES if code.split("_")[0] == lang]
  if len(found) == 1:
    return found[0]
  near = difflib.get_close_matches(lang, [*FAIRSEQ_LANGUAGE_CODES, *USUAL_CODES], n=5, cutoff=0.5)
  raise DataError(f"language {lang!r} has no NLLB-200 code (an NLLB code, its first part, or one of "
                  f"{len(USUAL_CODES)} usual codes); near: {', '.join(near) or 'none'}")


def added_tokens(config: dict, pieces: int) -> dict[str, tuple[int, bool, bool]]:
  """{content: (id, lstrip, rstrip)} of the added tokens: tokenizer_config.json's added_tokens_decoder, else NLLB's
  layout (the four specials, the codes after the `pieces` SentencePiece ids + 1, `<mask>` last)."""
  if decoder := config.get("added_tokens_decoder"):
    return {t["content"]: (int(i), bool(t.get("lstrip")), bool(t.get("rstrip"))) for i, t in decoder.items()}
  layout = [*SPECIALS, *FAIRSEQ_LANGUAGE_CODES]
  return {token: (i if i < 4 else pieces + i - 3, False, False) for i, token in enumerate(layout)} | {
      "<mask>": (pieces + 1 + len(FAIRSEQ_LANGUAGE_CODES), True, False)}


class NllbTokenizer(Tokenizer):
  """transformers' NllbTokenizer (non-legacy) of a tokenizer directory."""

  ids = IDS
  tags_every_source = True

  def __init__(self, directory: io.PathLike):
    self.path = io.path(directory)
    self.sp = spm.SentencePieceProcessor(model_proto=(self.path / MODEL).read_bytes())
    config = json.loads((self.path / CONFIG).read_text()) if (self.path / CONFIG).exists() else {}
    self.clean_up = bool(config.get("clean_up_tokenization_spaces", False))
    self.added = added_tokens(config, self.sp.get_piece_size())
    wrong = [t for i, t in enumerate(SPECIALS) if self.added.get(t, (None,))[0] != i]
    if wrong:
      raise DataError(f"{self.path / CONFIG}: {', '.join(wrong)} not at fairseq's ids 0-3 ({', '.join(SPECIALS)})")
    self.added_ids = {i for i, _, _ in self.added.values()}
    contents = sorted(self.added, key=len, reverse=True)  # the longest first, as transformers' trie matches
    self.split = re.compile("(" + "|".join(map(re.escape, contents)) + ")")

  @property
  def vocab_size(self) -> int:
    return max(self.sp.get_piece_size() + 1, max(self.added_ids) + 1)

  def code_id(self, lang: str) -> int:
    code = nllb_code(lang)
    if code not in self.added:
      raise DataError(f"{self.path}: this tokenizer has no language code {code!r} (for {lang!r})")
    return self.added[code][0]

  def tag_id(self, lang: str) -> int | None:
    """The language's code id (what moe.router='language' reads), None where it has none."""
    try:
      return self.code_id(lang)
    except DataError:
      return None

  def piece(self, i: int) -> str:
    return next((t for t, (j, _, _) in self.added.items() if j == i), None) or self.sp.id_to_piece(i - 1)

  def source_prefix(self, lang: str) -> list[int]:
    return [self.code_id(lang)]

  def forced(self, lang: str) -> tuple[int, ...]:
    return (self.code_id(lang),)

  def prefix(self, lang: str | None, target: bool) -> list[int]:
    if lang is None:
      raise ValueError("an NLLB sequence starts with its language's code: give its language")
    return super().prefix(lang, target)

  def pieces(self, texts: list[str], threads: int | None = None) -> list[list[int]]:
    """Fairseq ids of each text, split on the added tokens written in it."""
    return [self._text_ids(text) for text in texts]

  def _text_ids(self, text: str) -> list[int]:
    chunks = self.split.split(text)  # text, token, text, ...: odd indices are added tokens
    for k in range(1, len(chunks), 2):
      _, lstrip, rstrip = self.added[chunks[k]]
      if lstrip:
        chunks[k - 1] = chunks[k - 1].rstrip()
      if rstrip:
        chunks[k + 1] = chunks[k + 1].lstrip()
    out = []
    for k, chunk in enumerate(chunks):
      if k % 2:
        out.append(self.added[chunk][0])
      elif chunk:
        out.extend(i + 1 if i else self.ids.unk for i in self.sp.encode(chunk))
    return out

  def decode(self, ids) -> str:
    """transformers' decode(skip_special_tokens=True) of the ids up to the first EOS, as one line."""
    pieces = [self.sp.id_to_piece(i - 1) for i in self.until_eos(ids) if i not in self.added_ids]
    text = "".join(pieces).replace(WORD, " ").strip()
    if self.clean_up:
      for old, new in CLEAN_UP:
        text = text.replace(old, new)
    return one_line(text)

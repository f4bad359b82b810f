"""A tokenizer on disk (data.tokenizer, a prepared corpus's): which kind a path holds, its files and their hash,
loading it, copying it into a prepared directory.

The kind: a file is a SentencePiece model (this project's `spm.model`); a directory holding `spm.model` (a prepared
corpus) is that model; a directory whose tokenizer_config.json names an Nllb tokenizer class, or that holds
sentencepiece.bpe.model (what transformers' save_pretrained writes), is an NLLB tokenizer.
"""

from __future__ import annotations

import hashlib
import json

from gshard_mt import io
from gshard_mt.data import nllb, shards
from gshard_mt.data.tokenizer import SentencePieceTokenizer, Tokenizer
from gshard_mt.errors import DataError

KEY = "data.tokenizer"


def is_nllb(path: io.PathLike) -> bool:
  """Whether a directory holds an NLLB tokenizer (see the module's docstring)."""
  path = io.path(path)
  config = path / nllb.CONFIG
  named = config.exists() and "nllb" in str(json.loads(config.read_text()).get("tokenizer_class", "")).lower()
  return named or (path / nllb.MODEL).exists()


def found(path: io.PathLike, key: str = KEY) -> tuple[bool, list[io.epath.Path]]:
  """(whether it is an NLLB tokenizer, the files that make it) of the tokenizer at `path`; a one-line DataError
  naming `key` where there is none."""
  path = io.path(path)
  try:
    if path.is_file():
      return False, [path]
    if (path / shards.MODEL).is_file():
      return False, [path / shards.MODEL]
    if path.is_dir() and is_nllb(path):
      return True, [path / name for name in nllb.FILES if (path / name).exists()]
  except (OSError, ValueError) as e:  # ValueError: a tokenizer_config.json that is no JSON
    raise DataError(f"{key}={path}: cannot read it ({e})") from None
  raise DataError(f"{key}={path}: {'not found' if not path.exists() else 'neither a SentencePiece model file nor a'
                                   ' tokenizer directory (sentencepiece.bpe.model, tokenizer_config.json)'}")


def digest(path: io.PathLike, key: str = KEY) -> str:
  """A hash of the tokenizer's bytes (an NLLB tokenizer's: its files' names and bytes)."""
  h = hashlib.sha256()
  kind_nllb, paths = found(path, key)
  for f in paths:
    h.update((f.name.encode() + b"\0" if kind_nllb else b"") + f.read_bytes())
  return h.hexdigest()[:16]


def load(path: io.PathLike, key: str = KEY) -> Tokenizer:
  """The tokenizer at `path` (either kind); a one-line DataError naming `key` where it cannot be read."""
  kind_nllb, paths = found(path, key)
  try:
    return nllb.NllbTokenizer(paths[0].parent) if kind_nllb else SentencePieceTokenizer(paths[0])
  except (OSError, RuntimeError, ValueError) as e:  # SentencePiece: RuntimeError on a file that is no model
    raise DataError(f"{key}={io.path(path)}: not a readable tokenizer ({str(e).splitlines()[0]})") from None


def copy_into(path: io.PathLike, directory: io.PathLike, key: str = KEY):
  """Copies the tokenizer at `path` into the prepared `directory`: a SentencePiece model as `spm.model`, an NLLB
  tokenizer's files by their names (the directory then holds that tokenizer: `load(directory)`)."""
  kind_nllb, paths = found(path, key)
  for f in paths:
    name = f.name if kind_nllb else shards.MODEL
    (io.path(directory) / name).write_bytes(f.read_bytes())

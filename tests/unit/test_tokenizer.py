"""The shared tokenizer: trained once per prepared corpus, fixed special ids and tags, clear errors."""

import functools
import os

import numpy as np
import pytest

from gshard_mt.data import tokenizer
from gshard_mt.errors import DataError


def test_tokenizer_has_fixed_ids_and_tags(data):
  tok = data.tokenizer
  assert tok.path.name == "spm.model" and tok.path.parent.name.startswith("spm-600-")
  assert tok.path.parents[1].name == "tokenizer"  # <workdir>/tokenizer/spm-<V>-<key>/, beside the shards
  assert tok.ids == tokenizer.SENTENCEPIECE_IDS == tokenizer.SpecialIds(pad=0, eos=1, unk=2, start=0, never=(0, 2))
  assert (tok.sp.pad_id(), tok.sp.eos_id(), tok.sp.unk_id()) == (0, 1, 2)
  assert tok.forced("eng") == () and not tok.tags_every_source
  ids = tok.encode(["Nous sommes de votre avis."], "fra")[0]
  assert ids[0] == tok.tag_id("fra") and ids[-1] == tokenizer.SENTENCEPIECE_IDS.eos
  assert tok.decode(ids + [0, 0]) == "Nous sommes de votre avis."
  assert tok.tag_id("zzz") is None


def test_a_decoded_text_is_one_line(data):
  """Byte pieces can decode to line breaks; a hypothesis written one per line (eval's hyp.<lang>.txt, read back as
  a baseline) would then shift every later line against its reference."""
  tok = data.tokenizer
  pieces = ["▁a", "<0x0A>", "▁b", "<0x0D>", "c"]
  assert tok.sp.decode([tok.sp.piece_to_id(p) for p in pieces]).count("\n") == 1  # what SentencePiece gives
  assert tok.decode([tok.sp.piece_to_id(p) for p in pieces]) == "a  b c"


def test_encode_flat_is_encode_back_to_back(data):
  tok, texts = data.tokenizer, ["Nous sommes de votre avis.", "", "Ça va ? 42"]
  for lang in ("fra", None):
    tokens, lengths = tok.encode_flat(texts, lang, np.uint16)
    assert tokens.dtype == np.uint16 and lengths.tolist() == [len(ids) for ids in tok.encode(texts, lang)]
    assert tokens.tolist() == [i for ids in tok.encode(texts, lang) for i in ids]


def test_vocabulary_too_large_is_a_clear_error():
  with pytest.raises(DataError, match="data.vocab_size=500 is too large"):
    tokenizer.train(iter(["a b", "c d"] * 3), 500, [])


def test_trained_in_a_process_of_its_own_as_in_this_one():
  """What Ctrl-C can stop at once (tests/integration/test_workdir_faults.py): the same model, the same errors."""
  words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "home", "late", "sun", "is", "bright"]
  sentences = [" ".join(words[(i * k) % len(words)] for k in range(1, 8)) for i in range(500)]
  assert tokenizer.train_apart(functools.partial(iter, sentences), 500, 290, ["<fra>"]) == tokenizer.train(
      iter(sentences), 290, ["<fra>"])
  with pytest.raises(DataError, match="data.vocab_size=500 is too large"):
    tokenizer.train_apart(functools.partial(iter, ["a b", "c d"] * 3), 6, 500, [])


def test_the_time_it_takes_is_said_at_the_pace_measured():
  assert tokenizer.seconds_to_train(142_206) == pytest.approx(142_206 / (7_000 * os.cpu_count()))
  assert tokenizer.seconds_to_train(10) == 1.0

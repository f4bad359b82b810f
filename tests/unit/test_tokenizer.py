"""The shared tokenizer: cached, fixed special ids, language tags, clear errors."""


import pytest

from gshard_mt.data import corpus, tokenizer
from gshard_mt.errors import DataError


def test_tokenizer_is_cached_with_fixed_ids_and_tags(data, tokenizer_dir):
  tok = data.tokenizer
  assert tok.path.parent.name == "tokenizer" and tok.path.name.startswith("spm-600-")
  assert tok.sp.pad_id() == tokenizer.PAD_ID == 0 and tok.sp.eos_id() == tokenizer.EOS_ID == 1
  assert tok.sp.unk_id() == tokenizer.UNK_ID == 2
  ids = tok.encode(["Nous sommes de votre avis."], "fra")[0]
  assert ids[0] == tok.tag_id("fra") and ids[-1] == tokenizer.EOS_ID
  assert tok.decode(ids + [0, 0]) == "Nous sommes de votre avis."
  assert tok.tag_id("zzz") is None
  again = tokenizer.train_or_load(data.text["train"], tok.path.parents[1], 600, True)
  assert again.path == tok.path  # reused, not retrained
  assert list(tok.path.parent.glob("*-train-*.npz"))  # tokenized once, cached


def test_vocabulary_too_large_is_a_clear_error(tmp_path):
  tiny = {"xx": corpus.Pairs(["a b"] * 3, ["c d"] * 3)}
  with pytest.raises(DataError, match="data.vocab_size=500 is too large"):
    tokenizer.train_or_load(tiny, tmp_path, 500, False)

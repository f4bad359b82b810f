"""The shipped Multi30k source joined with Tatoeba into one corpus sampled over all streams, and a lossless
tokenizer (no UNK) trained on its training sides (the official splits: tests/unit/test_corpus.py)."""

import numpy as np
import pytest

from gshard_mt import config as config_lib
from gshard_mt.data import pipeline, sources, tokenizer
from tests.helpers import small_config

pytestmark = pytest.mark.slow  # trains a tokenizer on the joined corpora


@pytest.fixture(scope="module")
def joined(tmp_path_factory):
  config = small_config(**{"data.source": "tatoeba+multi30k", "data.languages": "deu,kab", "data.vocab_size": "1000"})
  return config, pipeline.load(config, tmp_path_factory.mktemp("joined"))


def test_joined_sources_keep_streams_apart_and_share_the_language_tag(joined):
  config, data = joined
  assert sorted(data.text["test"]) == ["deu.multi30k", "deu.tatoeba", "kab"]
  assert len(data.text["test"]["deu.multi30k"]) == 1000  # each stream keeps its own test set
  tok = data.tokenizer
  assert tok.tag_id("deu.multi30k") == tok.tag_id("deu.tatoeba") == tok.tag_id("deu") is not None
  counts = {s: len(p) for s, p in data.text["train"].items()}
  assert data.rates["deu.multi30k"] > data.rates["deu.tatoeba"] > 0
  assert sum(data.rates.values()) == pytest.approx(1.0)
  # The streams' rates follow n^(1/5) over all streams, and the batches follow the rates.
  weights = {s: n ** 0.2 for s, n in counts.items()}
  assert data.rates == pytest.approx({s: w / sum(weights.values()) for s, w in weights.items()})
  split = data.tokens["train"]
  stream_of = {}
  for i in range(len(split)):
    src = split.src_tokens[split.src_offsets[i]:split.src_offsets[i + 1]]
    stream_of.setdefault(src.astype(np.int32).tobytes(), split.languages[split.lang[i]])  # as in batches
  seen = {s: 0 for s in split.languages}
  batches = data.train_batches(config)
  for index in range(60):
    b = batches.batch(index)
    for row in range(b["inputs"].shape[0]):
      for seg in set(b["inputs_segmentation"][row]) - {0}:
        seen[stream_of[b["inputs"][row][b["inputs_segmentation"][row] == seg].tobytes()]] += 1
  observed = np.array([seen[s] for s in split.languages]) / sum(seen.values())
  np.testing.assert_allclose(observed, [data.rates[s] for s in split.languages], rtol=0.2)


def test_a_language_code_selects_all_its_streams(joined):
  config, _ = joined
  splits, _ = sources.load_corpus(config_lib.replace(config, {"data.languages": "deu.multi30k"}).data)
  assert sorted(splits["train"]) == ["deu.multi30k"]


def test_tokenizer_round_trip_is_lossless_without_unk(joined):
  _, data = joined
  tok = data.tokenizer
  lines = [line for pairs in data.text["train"].values() for line in [*pairs.src, *pairs.tgt]]
  lines += ["2 men, 30 somethings: 0123456789 and 3.14159", "😀🎉 ⁇ …  two  spaces", "ዐማርኛ ქართული ᏣᎳᎩ 𝄞 ﬁ"]
  for ids, line in zip(tok.encode(lines), lines):
    assert tokenizer.SENTENCEPIECE_IDS.unk not in ids, line
    assert tok.decode(ids) == line

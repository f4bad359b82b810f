"""The shipped Multi30k source: official splits kept, joined with Tatoeba into one corpus sampled over all streams,
and a lossless tokenizer (no UNK) on its training sides."""

import gzip

import numpy as np
import pytest

from gshard_mt.data import corpus, pipeline, tokenizer
from tests.helpers import small_config

FOLDER = corpus.SHIPPED / "multi30k"


def raw(name):
  return gzip.open(FOLDER / f"{name}.gz", "rt", encoding="utf-8").read().splitlines()


def test_official_splits_are_kept():
  splits, _ = corpus.load_corpus(small_config(**{"data.source": "multi30k", "data.languages": ""}).data)
  assert sorted(splits["test"]) == ["ces", "deu", "fra"]
  for code, lang in corpus.MULTI30K_LANGUAGES.items():
    assert splits["test"][lang].src == [s.strip() for s in raw(f"test_2016_flickr.{code}")]
    assert splits["test"][lang].tgt == [s.strip() for s in raw("test_2016_flickr.en")]
    assert splits["dev"][lang].src == [s.strip() for s in raw(f"val.{code}")]
    assert len(splits["train"][lang]) >= 28_990  # 29,000 lines less a few exact duplicates
  assert (FOLDER / "README.md").exists()


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
    stream_of.setdefault(src.tobytes(), split.languages[split.lang[i]])
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
  config.data.languages = "deu.multi30k"
  splits, _ = corpus.load_corpus(config.data)
  assert sorted(splits["train"]) == ["deu.multi30k"]


def test_tokenizer_round_trip_is_lossless_without_unk(joined):
  _, data = joined
  tok = data.tokenizer
  lines = [line for pairs in data.text["train"].values() for line in pairs.src + pairs.tgt]
  lines += ["2 men, 30 somethings: 0123456789 and 3.14159", "😀🎉 ⁇ …  two  spaces", "ዐማርኛ ქართული ᏣᎳᎩ 𝄞 ﬁ"]
  for ids, line in zip(tok.encode(lines), lines):
    assert tokenizer.UNK_ID not in ids, line
    assert tok.decode(ids) == line

"""BLEU during training: the stratified dev sample, and the scores of its translations (with stand-in translators)."""

import collections

import numpy as np
import pytest

from gshard_mt.data import packing, pipeline
from gshard_mt.errors import ConfigError
from gshard_mt.training import loop
from tests.helpers import small_config


def fake_split(sizes: dict[str, int]) -> packing.TokenizedSplit:
  """A split with `sizes[lang]` pairs per language, interleaved (only the language of each pair matters here)."""
  languages = sorted(sizes)
  lang = np.concatenate([np.full(n, languages.index(code), np.int32) for code, n in sizes.items()])
  lang = np.random.default_rng(1).permutation(lang)
  empty = np.zeros(len(lang) + 1, np.int64)
  return packing.TokenizedSplit(languages, lang, np.zeros(0, np.int32), empty, np.zeros(0, np.int32), empty)


SIZES = {"fra": 40, "deu": 3, "kab": 1, "ell": 12, "spa": 25}


def test_sample_is_fixed_by_the_seed():
  split = fake_split(SIZES)
  a, b = (loop.stratified_sample(split, list(SIZES), 20, seed=0) for _ in range(2))
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  other = loop.stratified_sample(split, list(SIZES), 20, seed=1)
  assert any(not np.array_equal(a[k], other[k]) for k in a)


@pytest.mark.parametrize("budget", [1, 3, 5, 11, 20, 60, 81, 500])
def test_sample_spreads_the_budget_over_the_languages(budget):
  split = fake_split(SIZES)
  sample = loop.stratified_sample(split, list(SIZES), budget, seed=0)
  counts = collections.Counter({lang: len(positions) for lang, positions in sample.items()})
  assert sum(counts.values()) == min(budget, sum(SIZES.values()))
  assert len(sample) == min(budget, len(SIZES))  # every language once the budget allows
  # Even: a language has fewer than another only when it has no more pairs.
  for lang, n in SIZES.items():
    assert counts[lang] <= n
    if counts[lang] < n:
      assert counts[lang] >= max(counts.values()) - 1
  for lang, positions in sample.items():  # distinct, sorted positions among the language's pairs
    assert np.all(np.diff(positions) > 0) and positions[-1] < SIZES[lang]


def test_sample_skips_languages_without_pairs():
  split = fake_split({"fra": 5, "deu": 0})
  assert list(loop.stratified_sample(split, ["fra", "deu"], 10, seed=0)) == ["fra"]


class EchoTranslator:
  """Outputs each pair's reference target tokens, or (shift=1) those of the next pair of the split."""

  def __init__(self, split: packing.TokenizedSplit, shift: int = 0):
    self.split, self.shift, self.rows = split, shift, []

  def by_pair(self, batch):
    self.rows.append(len(batch["index"]))
    out = {}
    for pair in batch["index"]:
      if pair >= 0:
        j = (pair + self.shift) % len(self.split)
        out[int(pair)] = self.split.tgt_tokens[self.split.tgt_offsets[j]:self.split.tgt_offsets[j + 1]].tolist()
    return out


def test_bleu_of_the_references_is_100_and_of_other_sentences_low(data):
  dev = data.tokens["dev"]
  sample = loop.stratified_sample(dev, list(data.text["dev"]), 12, seed=0)
  perfect = EchoTranslator(dev)
  scores = loop.evaluate_bleu(perfect, data, sample, rows=8, max_length=24)
  assert scores["dev_bleu"] == pytest.approx(100.0) and scores["dev_chrf"] == pytest.approx(100.0)
  assert scores["dev_bleu_sentences"] == 12 and perfect.rows == [8, 8]
  # Each language's references line up with its own pairs: another pair's target scores far lower.
  wrong = loop.evaluate_bleu(EchoTranslator(dev, shift=1), data, sample, rows=8, max_length=24)
  assert wrong["dev_bleu"] < 30 and wrong["dev_chrf"] < 50


def test_sample_covers_the_dev_languages(data):
  dev = data.tokens["dev"]
  sample = loop.stratified_sample(dev, list(data.text["dev"]), 64, seed=0)
  assert sorted(sample) == sorted(data.text["dev"])
  for lang, positions in sample.items():
    assert len(positions) >= min(64 // len(sample), len(pipeline.language_ids(dev, lang)))


def test_bad_bleu_keys_are_config_errors():
  with pytest.raises(ConfigError, match="eval_bleu_every=-1: expected an integer >= 0"):
    small_config(eval_bleu_every=-1)
  with pytest.raises(ConfigError, match="eval_bleu_sentences=0: expected a positive integer"):
    small_config(eval_bleu_sentences=0)

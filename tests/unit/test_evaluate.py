"""Scoring: BLEU and chrF++ as sacrebleu computes them, a hand-computed BLEU, resource buckets."""

import math

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

from gshard_mt.evaluation import evaluate


def test_scores_agree_with_sacrebleu():
  refs = ["The cat sat on the mat.", "It is raining today.", "We agree with you."]
  hyps = ["The cat sat on a mat.", "It rains today.", "We agree with you."]
  s = evaluate.score(hyps, refs, BLEU(), CHRF(word_order=2))
  assert s["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
  assert s["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs], word_order=2).score)
  perfect = evaluate.score(refs, refs, BLEU(), CHRF(word_order=2))  # identical: 100
  assert perfect["bleu"] == pytest.approx(100.0) and perfect["chrf"] == pytest.approx(100.0)


def test_resource_buckets_keep_ties_together():
  buckets = evaluate.resource_buckets({"a": 800, "b": 800, "c": 800, "d": 100, "e": 90, "f": 10})
  assert buckets["a"] == buckets["b"] == buckets["c"] == "high"
  assert buckets["d"] == "medium" and buckets["f"] == "low"


def test_bleu_by_hand():
  """'a b c d x y' against 'a b c d e f': 1- to 4-gram precisions 4/6, 3/5, 2/4, 1/3, equal lengths."""
  s = evaluate.score(["a b c d x y"], ["a b c d e f"], BLEU(), CHRF(word_order=2))
  assert s["bleu"] == pytest.approx(100 * math.exp(sum(map(math.log, (4 / 6, 3 / 5, 2 / 4, 1 / 3))) / 4))
  assert s["sentences"] == 1

"""eval.py end to end on a tiny trained work directory, the scores, and the error paths."""

import json
import shutil

import pytest
import sacrebleu

from gshard_mt import evaluate, train
from gshard_mt.evaluate import EvalError
from sacrebleu.metrics import BLEU, CHRF
from conftest import small_config

LANGS = ["fra", "ell"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tokenizer_dir):
  workdir = tmp_path_factory.mktemp("evaluate") / "run"
  shutil.copytree(tokenizer_dir, workdir / "tokenizer")
  train.train_and_evaluate(small_config(), workdir)
  return workdir


def test_train_then_eval_writes_scores_and_report(trained):
  scores = evaluate.evaluate(trained, split="test", beam_size=2, languages=LANGS, max_decode_len=10)
  out = trained / "eval" / "test-6"
  assert scores["output_dir"] == str(out)
  for name in ("scores.json", "report.md", "bleu_by_language.png", "hyp.fra.txt", "hyp.ell.txt"):
    assert (out / name).exists(), name
  saved = json.loads((out / "scores.json").read_text())
  assert set(saved["languages"]) == set(LANGS) and saved["step"] == 6
  fra = saved["languages"]["fra"]
  assert fra["sentences"] == len((out / "hyp.fra.txt").read_text().splitlines()) == 100
  assert 0 <= fra["bleu"] <= 100 and 0 <= fra["chrf"] <= 100
  assert saved["average"]["bleu"] == pytest.approx((fra["bleu"] + saved["languages"]["ell"]["bleu"]) / 2)
  assert saved["decoding"]["beam_size"] == 2 and saved["decoding"]["sentences_per_s"] > 0
  assert "BLEU" in (out / "report.md").read_text() and "nrefs:1" in saved["signatures"]["bleu"]
  assert not list((trained / "eval").glob(".*tmp*"))  # nothing half-written left behind


def test_baseline_gives_delta_bleu(trained):
  evaluate.evaluate(trained, split="dev", beam_size=1, languages=LANGS, max_decode_len=8)
  scores = evaluate.evaluate(trained, split="dev", beam_size=1, languages=LANGS, max_decode_len=8, baseline=trained,
                             bootstrap_samples=50)
  assert scores["average"]["delta_bleu"] == pytest.approx(0.0)  # the same system against itself
  assert all("delta_bleu" in s and "bootstrap_p" in s for s in scores["languages"].values())


def test_scores_agree_with_sacrebleu():
  refs = ["The cat sat on the mat.", "It is raining today.", "We agree with you."]
  hyps = ["The cat sat on a mat.", "It rains today.", "We agree with you."]
  s = evaluate.score(hyps, refs, BLEU(), CHRF(word_order=2))
  assert s["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
  assert s["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs], word_order=2).score)
  perfect = evaluate.score(refs, refs, BLEU(), CHRF(word_order=2))
  assert perfect["bleu"] == pytest.approx(100.0) and perfect["chrf"] == pytest.approx(100.0)


def test_resource_buckets_keep_ties_together():
  buckets = evaluate.resource_buckets({"a": 800, "b": 800, "c": 800, "d": 100, "e": 90, "f": 10})
  assert buckets["a"] == buckets["b"] == buckets["c"] == "high"
  assert buckets["d"] == "medium" and buckets["f"] == "low"


def test_error_paths(trained, tmp_path):
  with pytest.raises(EvalError, match="unknown language code"):
    evaluate.evaluate(trained, split="test", languages=["fra", "zzz"])
  with pytest.raises(EvalError, match="has no scores for the test split"):
    evaluate.evaluate(trained, split="test", languages=LANGS, baseline=tmp_path)
  with pytest.raises(EvalError, match="no checkpoint for step 5"):
    evaluate.evaluate(trained, split="test", step=5, languages=LANGS)
  empty = tmp_path / "untrained"
  shutil.copytree(trained, empty, ignore=shutil.ignore_patterns("checkpoints", "eval"))
  with pytest.raises(EvalError, match="has no checkpoint: train first"):
    evaluate.evaluate(empty, split="test")
  changed = tmp_path / "changed"
  shutil.copytree(trained, changed, ignore=shutil.ignore_patterns("eval"))
  config = json.loads((changed / "config.json").read_text())
  config["model"]["mlp_dim"] = 96
  (changed / "config.json").write_text(json.dumps(config))
  with pytest.raises(EvalError, match="does not match .*config.json"):
    evaluate.evaluate(changed, split="test", languages=LANGS)
  assert not (changed / "eval").exists()

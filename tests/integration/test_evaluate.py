"""eval.py end to end on a tiny trained work directory, the scores, and the error paths."""

import json
import shutil

import pytest
import sacrebleu

from gshard_mt import lock
from gshard_mt.data import sources
from gshard_mt.errors import UserError, WorkdirError
from gshard_mt.evaluation import evaluate
from gshard_mt.training import loop
from tests.helpers import small_config

pytestmark = pytest.mark.slow  # trains, compiles for many devices or starts processes

LANGS = ["fra", "ell"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tokenizer_dir):
  workdir = tmp_path_factory.mktemp("evaluate") / "run"
  shutil.copytree(tokenizer_dir, workdir / "tokenizer")
  loop.train_and_evaluate(small_config(), workdir)
  return workdir


def test_train_then_eval_writes_scores_and_report(trained):
  scores = evaluate.evaluate(trained, split="test", beam_size=2, languages=LANGS, max_decode_len=10)
  out = trained / "eval" / "test-6-beam2-len10-ell+fra"  # not the standard evaluation: its settings in the name
  assert scores["output_dir"] == str(out)
  for name in ("scores.json", "report.md", "bleu_by_language.png", "hyp.fra.txt", "hyp.ell.txt"):
    assert (out / name).exists(), name
  saved = json.loads((out / "scores.json").read_text())
  assert set(saved["languages"]) == set(LANGS) and saved["step"] == 6
  fra = saved["languages"]["fra"]
  assert fra["sentences"] == len((out / "hyp.fra.txt").read_text().splitlines()) == 100
  hyps = (out / "hyp.fra.txt").read_text().splitlines()
  refs = [r.strip() for r in sources.load_corpus(
      small_config().data)[0]["test"]["fra"].tgt]
  assert fra["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)  # scored against its references
  assert fra["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs], word_order=2).score)
  assert saved["average"]["bleu"] == pytest.approx((fra["bleu"] + saved["languages"]["ell"]["bleu"]) / 2)
  assert saved["decoding"]["beam_size"] == 2 and saved["decoding"]["sentences_per_s"] > 0
  assert "BLEU" in (out / "report.md").read_text() and "nrefs:1" in saved["signatures"]["bleu"]
  assert not list((trained / "eval").glob(".*tmp*"))  # nothing half-written left behind


def test_a_second_eval_of_the_same_output_is_refused(trained):
  with lock.hold(trained / "eval", name=".test-6-beam1-len4-fra.lock"):  # an eval.py of these settings is writing
    with pytest.raises(WorkdirError, match=r"eval is in use by another writer: host .*, pid \d+"):
      evaluate.evaluate(trained, split="test", beam_size=1, languages=["fra"], max_decode_len=4)


def test_baseline_gives_delta_bleu(trained):
  evaluate.evaluate(trained, split="dev", beam_size=1, languages=LANGS, max_decode_len=8)
  scores = evaluate.evaluate(trained, split="dev", beam_size=1, languages=LANGS, max_decode_len=8, baseline=trained,
                             bootstrap_samples=50)
  assert scores["average"]["delta_bleu"] == pytest.approx(0.0)  # the same system against itself
  assert all("delta_bleu" in s and "bootstrap_p" in s for s in scores["languages"].values())


def test_error_paths(trained, tmp_path):
  with pytest.raises(WorkdirError, match="unknown language code"):
    evaluate.evaluate(trained, split="test", languages=["fra", "zzz"])
  with pytest.raises(WorkdirError, match="has no scores for the test split"):
    evaluate.evaluate(trained, split="test", languages=LANGS, baseline=tmp_path)
  with pytest.raises(WorkdirError, match="--baseline .*/nowhere: no such directory"):
    evaluate.evaluate(trained, split="test", languages=LANGS, baseline=tmp_path / "nowhere")
  with pytest.raises(UserError, match="--bootstrap 100 tests the difference to a baseline: it needs --baseline"):
    evaluate.evaluate(trained, split="test", languages=LANGS, bootstrap_samples=100)
  with pytest.raises(WorkdirError, match="no checkpoint for step 5"):
    evaluate.evaluate(trained, split="test", step=5, languages=LANGS)
  empty = tmp_path / "untrained"
  shutil.copytree(trained, empty, ignore=shutil.ignore_patterns("checkpoints", "eval"))
  with pytest.raises(WorkdirError, match="has no checkpoint: train first"):
    evaluate.evaluate(empty, split="test")
  changed = tmp_path / "changed"
  shutil.copytree(trained, changed, ignore=shutil.ignore_patterns("eval"))
  config = json.loads((changed / "config.json").read_text())
  config["model"]["mlp_dim"] = 96
  (changed / "config.json").write_text(json.dumps(config))
  with pytest.raises(WorkdirError, match=r"no checkpoint in .* restores: step 6: \w+.*; they are unreadable or do "
                                         r"not match .*changed/config.json"):
    evaluate.evaluate(changed, split="test", languages=LANGS)
  assert not (changed / "eval").exists()
  with pytest.raises(WorkdirError, match=r"the checkpoint of step 6 in .* cannot be restored: it is unreadable or "
                                         r"does not match .*changed/config.json \(\w+"):
    evaluate.evaluate(changed, split="test", step=6, languages=LANGS)

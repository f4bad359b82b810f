"""Scoring: BLEU and chrF++ as sacrebleu computes them, a hand-computed BLEU, resource buckets, ΔBLEU and its
paired bootstrap p-value against sacrebleu, checkpoint averaging against numpy."""

import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

from gshard_mt.errors import WorkdirError
from gshard_mt.evaluation import baseline, evaluate, outputs
from gshard_mt.training import scoring


def test_scores_agree_with_sacrebleu():
  refs = ["The cat sat on the mat.", "It is raining today.", "We agree with you."]
  hyps = ["The cat sat on a mat.", "It rains today.", "We agree with you."]
  s = scoring.score(hyps, refs, BLEU(), CHRF(word_order=2))
  assert s["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
  assert s["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs], word_order=2).score)
  perfect = scoring.score(refs, refs, BLEU(), CHRF(word_order=2))  # identical: 100
  assert perfect["bleu"] == pytest.approx(100.0) and perfect["chrf"] == pytest.approx(100.0)


def test_resource_buckets_keep_ties_together():
  buckets = evaluate.resource_buckets({"a": 800, "b": 800, "c": 800, "d": 100, "e": 90, "f": 10})
  assert buckets["a"] == buckets["b"] == buckets["c"] == "high"
  assert buckets["d"] == "medium" and buckets["f"] == "low"


def test_a_languages_bucket_is_among_all_the_runs_languages_whichever_are_evaluated():
  """eval.py --languages c: c, the run's least-trained language, is 'low' (it was 'high', the top of a bucket
  table of one)."""
  class Pairs(types.SimpleNamespace):
    def __len__(self):
      return len(self.tgt)

  pairs = lambda n: Pairs(tgt=["x"] * n)  # noqa: E731
  text = {"train": {"a": pairs(800), "b": pairs(100), "c": pairs(10)}, "test": {"c": pairs(2)}}
  run = types.SimpleNamespace(data=types.SimpleNamespace(text=text))
  per_lang, _ = evaluate.score_languages(run, split="test", hyps={"c": ["x", "x"]}, base=None, bootstrap_samples=0)
  assert per_lang["c"]["resource"] == "low" and per_lang["c"]["train_pairs"] == 10


def test_bleu_by_hand():
  """'a b c d x y' against 'a b c d e f': 1- to 4-gram precisions 4/6, 3/5, 2/4, 1/3, equal lengths."""
  s = scoring.score(["a b c d x y"], ["a b c d e f"], BLEU(), CHRF(word_order=2))
  assert s["bleu"] == pytest.approx(100 * math.exp(sum(map(math.log, (4 / 6, 3 / 5, 2 / 4, 1 / 3))) / 4))
  assert s["sentences"] == 1


@pytest.mark.parametrize("count", [3, 5])
def test_average_params_is_the_mean_cast_back(count):
  """Against numpy's mean of each leaf: float32 leaves stay float32, bfloat16 leaves come back bfloat16 (rounded
  once, from the float32 mean). A running pairwise mean, right for 2 trees, is wrong for 3 and 5."""
  rng = np.random.default_rng(count)
  trees = [{"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.bfloat16), "b": {"c": rng.normal(size=5).astype(np.float32)}}
           for _ in range(count)]
  got = evaluate.average_params(iter(trees))
  want = jax.tree.map(lambda *xs: np.mean([np.asarray(x, np.float32) for x in xs], axis=0), *trees)
  assert got["w"].dtype == jnp.bfloat16 and got["b"]["c"].dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got["w"], np.float32), want["w"], rtol=2**-8)  # bf16 has 8 bits
  np.testing.assert_allclose(got["b"]["c"], want["b"]["c"], rtol=1e-6)
  # Summed in float32: 256 + 1 + 1 is 258 (in bfloat16 each + 1 rounds back to 256), so the mean is 86, not 85.5.
  ones = [jnp.full((2,), v, jnp.bfloat16) for v in (256.0, 1.0, 1.0)]
  np.testing.assert_array_equal(np.asarray(evaluate.average_params(ones), np.float32), [86.0, 86.0])


REFS = ["The cat sat on the mat .", "It is raining in the city today .", "We agree with you on this point .",
        "The train leaves at six in the morning .", "She reads a book every evening .",
        "My brother lives in a small house .", "The children are playing in the garden .",
        "He forgot his umbrella at the office ."]
SYSTEM = ["The cat sat on the mat .", "It is raining in the town today .", "We agree with you on this point .",
          "The train leaves at six in the morning .", "She reads one book every evening .",
          "My brother lives in a little house .", "Children are playing in the garden .",
          "He forgot his umbrella at the office ."]
BASE = [SYSTEM[0], "It rains in the city today .", "We agree with you .", *SYSTEM[3:6], "The kids play in the garden .",
        SYSTEM[7]]  # three sentences worse: ΔBLEU 11.5, p about 0.1


def bootstrap_p(hyps, base_hyps, refs, samples, seed):
  """Paired bootstrap resampling as sacrebleu runs it (`_paired_bs_test`), from corpus BLEU alone: resample the
  sentences with numpy's default_rng(seed); the statistic is |ΔBLEU| of each resample, centred on its mean;
  p = (1 + resamples whose statistic exceeds the real |ΔBLEU|) / (1 + resamples)."""
  def bleu(h, idx=slice(None)):
    return sacrebleu.corpus_bleu(list(np.asarray(h)[idx]), [list(np.asarray(refs)[idx])]).score

  idxs = np.random.default_rng(seed).choice(len(refs), size=(samples, len(refs)), replace=True)
  diffs = np.array([abs(bleu(hyps, idx) - bleu(base_hyps, idx)) for idx in idxs])
  return (np.sum(diffs - diffs.mean() > abs(bleu(hyps) - bleu(base_hyps))) + 1) / (samples + 1)


def test_delta_bleu_and_bootstrap_p_against_sacrebleu(monkeypatch):
  """Two different systems: ΔBLEU is the system's sacrebleu BLEU minus the baseline's (a sign error fails, as
  does any antisymmetric formula), and the p-value is the paired bootstrap's with the same seed."""
  monkeypatch.setenv("SACREBLEU_SEED", "7")
  bleu, base_bleu = (scoring.score(h, REFS, BLEU(), CHRF(word_order=2))["bleu"] for h in (SYSTEM, BASE))
  out = evaluate.versus_baseline(bleu, base_bleu, SYSTEM, BASE, REFS, 100)
  want = sacrebleu.corpus_bleu(SYSTEM, [REFS]).score - sacrebleu.corpus_bleu(BASE, [REFS]).score
  assert want > 10 and out["delta_bleu"] == pytest.approx(want)
  p = bootstrap_p(SYSTEM, BASE, REFS, 100, seed=7)
  assert 0.05 < p < 0.5 and out["bootstrap_p"] == pytest.approx(p, abs=1e-12)
  assert evaluate.versus_baseline(bleu, base_bleu, SYSTEM, None, REFS, 100) == {"delta_bleu": out["delta_bleu"]}


def test_each_setting_names_its_own_output_and_only_the_standard_one_is_plain(tmp_path):
  """eval/<split>-<step>/ is the standard evaluation; any other setting adds a part, so a quick check of one
  language with beam 1 never replaces the full evaluation of the same step (it used to)."""
  name = outputs.output_name
  assert name("test", 600) == "test-600"
  assert name("test", 600, beam_size=1, languages=["fra"]) == "test-600-beam1-fra"
  assert name("dev", 5, averaged=3, alpha=1.0, max_decode_len=8, languages=["ell", "fra"]) == (
      "dev-5-avg3-alpha1-len8-ell+fra")
  many = [f"l{i:02d}" for i in range(20)]
  assert name("test", 1, languages=many).startswith("test-1-20langs-")
  assert name("test", 1, languages=many) != name("test", 1, languages=many[1:] + ["l99"])
  assert name("test", 600, batch_size=6) == "test-600-bs6"  # a batch's sentences share the experts' capacity
  settings = [{}, {"beam_size": 1}, {"alpha": 0.8}, {"max_decode_len": 8}, {"averaged": 2}, {"languages": ["fra"]},
              {"batch_size": 6}]
  assert len({name("test", 600, **s) for s in settings}) == len(settings)
  for folder in ("test-600", "test-600-beam1-fra", "test-1000", "test-1000-avg2", "dev-1200"):
    (tmp_path / "eval" / folder).mkdir(parents=True)
    (tmp_path / "eval" / folder / "scores.json").write_text("{}")
  assert list(outputs.standard_evaluations(tmp_path, "test")) == [600, 1000]


def test_steps_to_average_takes_the_last_count_up_to_the_step_and_refuses_what_it_cannot_take():
  assert evaluate.steps_to_average([2, 4, 6, 8], None, 2, "w") == (6, 8)
  assert evaluate.steps_to_average([2, 4, 6, 8], 6, 3, "w") == (2, 4, 6)
  with pytest.raises(WorkdirError, match="needs 4 checkpoints, but w/checkpoints has 3 up to step 6"):
    evaluate.steps_to_average([2, 4, 6, 8], 6, 4, "w")
  for count in (0, -1):  # restore() is called without flags.check too (tools, bench): upto[-0:] would take them all
    with pytest.raises(WorkdirError, match=f"--average_last must be at least 1, got {count}"):
      evaluate.steps_to_average([2, 4, 6, 8], None, count, "w")


def test_a_baseline_over_other_references_is_refused():
  """Its digest (or, in scores written before the digest, its number of sentences) must match each shared
  language's references: ΔBLEU and the bootstrap's line-by-line pairing over other sentences mean nothing."""
  refs = {"deu": ["a b", "c d"], "fra": ["e f"]}
  base = {"path": "runs/dense/eval/test-600",
          "languages": {"deu": {"sentences": 2, "references": baseline.references_digest(["a b", "c d"])},
                        "fra": {"sentences": 1}, "spa": {"sentences": 9}}}  # fra: an older scores.json
  baseline.check_references(base, refs, "test")
  for changed in ({"deu": ["a b", "x y"]}, {"fra": ["e f", "g h"]}):
    with pytest.raises(WorkdirError, match=r"--baseline runs/dense/eval/test-600: its (deu|fra) scores are "
                                                    r"over other test references than this run's \((2|1) sentences"):
      baseline.check_references(base, refs | changed, "test")


def run_with_test_pairs(sizes: dict[str, int]):
  """A restored run's stand-in whose test split has `sizes[lang]` pairs per language (data.min_eval_pairs=0)."""
  text = {lang: types.SimpleNamespace(tgt=["x"] * n) for lang, n in sizes.items()}
  data = types.SimpleNamespace(tokens={"test": types.SimpleNamespace(languages=sorted(sizes))}, text={"test": text})
  config = types.SimpleNamespace(data=types.SimpleNamespace(test_fraction=0.1, min_eval_pairs=0))
  return types.SimpleNamespace(data=data, workdir="runs/x", config=config)


def test_languages_without_pairs_are_left_out_or_refused_before_decoding():
  """Every language with test pairs by default; one asked for without pairs, or a split with none, is one line
  (sacrebleu and the bootstrap interval would fail on an empty language after the whole decode)."""
  run = run_with_test_pairs({"fra": 3, "xho": 0, "deu": 2})
  assert evaluate.evaluated_languages(run, "test", None) == ["deu", "fra"]
  assert evaluate.evaluated_languages(run, "test", ["fra"]) == ["fra"]
  with pytest.raises(WorkdirError, match=r"--languages xho: no test pairs in runs/x \(data.min_eval_pairs=0"):
    evaluate.evaluated_languages(run, "test", ["fra", "xho"])
  with pytest.raises(WorkdirError, match="unknown language code"):
    evaluate.evaluated_languages(run, "test", ["zzz"])
  with pytest.raises(WorkdirError, match=r"the test split of runs/x has no pairs to translate \(data.test_f"):
    evaluate.evaluated_languages(run_with_test_pairs({"xho": 0}), "test", None)

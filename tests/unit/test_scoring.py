"""One statistic: the BLEU that training logs (`dev_eval.evaluate_bleu`) and eval.py's average (`evaluate.decode_pairs`,
`score_languages`, `averages`) give the same number on the same hypotheses: each language's corpus BLEU, then the
mean over the languages, which is neither the BLEU of the pooled sentences nor a mean of sentence BLEUs."""

import numpy as np
import pytest
import sacrebleu

from gshard_mt.data import pipeline
from gshard_mt.evaluation import evaluate
from gshard_mt.training import dev_eval, scoring
from tests.helpers import small_config


class DegradingTranslator:
  """Outputs each pair's reference target tokens, cut to a fraction that depends on the pair's language (the
  languages score differently) and, for every third pair, those of the next pair of the split."""

  def __init__(self, split):
    self.split = split

  def __call__(self, batch):  # eval.py's decode_pairs compiles with one call first
    return None

  def by_pair(self, batch):
    out = {}
    for pair in batch["index"]:
      if pair >= 0:
        j = (pair + (pair % 3 == 0)) % len(self.split)
        tokens = self.split.tgt_tokens[self.split.tgt_offsets[j]:self.split.tgt_offsets[j + 1]].tolist()
        keep = (1 + int(self.split.lang[pair])) / (1 + len(self.split.languages))
        out[int(pair)] = tokens[:max(1, round(keep * len(tokens)))]
    return out


@pytest.fixture(scope="module")
def both(data):
  """(training's scores, eval.py's (per-language, average) scores) of the whole dev split, one translator."""
  dev = data.tokens["dev"]
  translator = DegradingTranslator(dev)
  config = small_config()
  languages = sorted(data.text["dev"])
  everything = dev_eval.language_sample(dev, languages, per_language=10**6, max_sentences=10**9, seed=0)
  training = dev_eval.evaluate_bleu(translator, data, everything, rows=8, max_length=config.data.max_length)
  run = evaluate.Restored(workdir=None, config=config, data=data, model_cfg=None, step=0, params=None)
  ids = {lang: pipeline.language_ids(dev, lang) for lang in languages}
  hyp_by_id, _ = evaluate.decode_pairs(translator, run, split="dev", ids=np.concatenate(list(ids.values())), rows=8,
                                       progress=False)
  hyps = {lang: [hyp_by_id[int(i)] for i in lang_ids] for lang, lang_ids in ids.items()}
  per_lang, _ = evaluate.score_languages(run, split="dev", hyps=hyps, base=None, bootstrap_samples=0)
  overall, _ = evaluate.averages(per_lang, None)
  return training, per_lang, overall, hyps


def test_training_and_eval_give_the_same_number(both):
  training, _, overall, _ = both
  assert training["dev_bleu_sentences"] == sum(s["sentences"] for s in both[1].values())
  assert training["dev_bleu_greedy"] == pytest.approx(overall["bleu"], abs=1e-9)
  assert training["dev_chrf_greedy"] == pytest.approx(overall["chrf"], abs=1e-9)


def test_it_is_the_mean_of_each_languages_corpus_bleu(both, data):
  """Against sacrebleu directly; the pooled corpus BLEU and the mean sentence BLEU are other numbers here, so the
  test tells them apart."""
  training, per_lang, overall, hyps = both
  refs = {lang: data.text["dev"][lang].tgt for lang in hyps}
  by_hand = {lang: sacrebleu.corpus_bleu(hyps[lang], [list(refs[lang])]).score for lang in hyps}
  assert len(set(np.round(list(by_hand.values()), 3))) == len(by_hand)  # the languages score differently
  assert {lang: s["bleu"] for lang, s in per_lang.items()} == pytest.approx(by_hand)
  assert training["dev_bleu_greedy"] == pytest.approx(np.mean(list(by_hand.values())))
  pooled = sacrebleu.corpus_bleu(sum(hyps.values(), []), [sum((list(r) for r in refs.values()), [])]).score
  sentences = np.mean([sacrebleu.sentence_bleu(h, [r]).score for lang in hyps for h, r in zip(hyps[lang], refs[lang])])
  assert abs(pooled - training["dev_bleu_greedy"]) > 1 and abs(sentences - training["dev_bleu_greedy"]) > 1


def test_a_sample_is_scored_on_its_own_references(data):
  """A per-language sample: training's figure is the same statistic over the sampled pairs alone."""
  dev = data.tokens["dev"]
  translator = DegradingTranslator(dev)
  sample = dev_eval.language_sample(dev, sorted(data.text["dev"]), 4, 1000, seed=3)
  training = dev_eval.evaluate_bleu(translator, data, sample, rows=8, max_length=24)
  hyps, refs = {}, {}
  for lang, positions in sample.items():
    pairs = translator.by_pair({"index": pipeline.language_ids(dev, lang)[positions]})
    hyps[lang] = [data.tokenizer.decode(seq) for seq in pairs.values()]
    refs[lang] = [data.text["dev"][lang].tgt[k] for k in positions]
  per_lang, _ = scoring.by_language(hyps, refs)
  assert training["dev_bleu_greedy"] == pytest.approx(scoring.mean_over_languages(per_lang, "bleu"), abs=1e-9)
  assert training["dev_bleu_sentences"] == 4 * len(sample)


def test_mismatched_inputs_are_refused():
  with pytest.raises(ValueError, match="different languages"):
    scoring.by_language({"fra": ["a"]}, {"deu": ["a"]})
  with pytest.raises(ValueError, match="fra: 2 hypotheses for 1 references"):
    scoring.by_language({"fra": ["a", "b"]}, {"fra": ["a"]})


HYPS = ["the cat sat on the mat", "a dog ran in the park", "it is a fine day", "he reads a long book today",
        "we went home late", "the sun is bright"]
REFS = ["the cat sat on the mat", "the dog ran in a park", "it is a nice day", "he is reading a long book",
        "we came home late", "the sun was bright"]


def test_each_resample_of_the_interval_is_scored_as_sacrebleu_scores_that_corpus():
  """One resample: the interval is the corpus BLEU of the sentences drawn, each as often as drawn."""
  times = np.random.default_rng(3).multinomial(len(HYPS), np.full(len(HYPS), 1 / len(HYPS)), size=1)[0]
  hyps = [h for h, k in zip(HYPS, times) for _ in range(k)]
  refs = [r for r, k in zip(REFS, times) for _ in range(k)]
  expected = sacrebleu.BLEU().corpus_score(hyps, [refs]).score
  assert scoring.bleu_interval(HYPS, REFS, samples=1, seed=3) == pytest.approx((expected, expected))


def test_the_interval_holds_the_score_and_is_the_same_again():
  low, high = scoring.bleu_interval(HYPS, REFS)
  assert low < sacrebleu.BLEU().corpus_score(HYPS, [REFS]).score < high and high - low > 5  # six sentences: wide
  assert scoring.bleu_interval(HYPS, REFS) == (low, high)  # the fixed seed
  assert scoring.bleu_interval(REFS, REFS) == pytest.approx((100.0, 100.0))

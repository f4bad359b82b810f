"""The one translation-quality statistic of the project, which eval.py reports and training logs on its dev sample:
each language's corpus BLEU and chrF++ over its sentences (sacrebleu: 13a tokenization, cased, detokenized text),
then the plain mean over the languages (a macro average: every language counts once, whatever its size).

  per_lang, signatures = by_language(hyps, refs)    # {lang: {'bleu', 'chrf', 'sentences'}}, sacrebleu signatures
  mean_over_languages(per_lang, "bleu")             # eval.py's average BLEU; training's dev_bleu_greedy
  bleu_interval(hyps["fra"], refs["fra"])           # its 95% interval: (low, high), by resampling the sentences

It is not the BLEU of all languages' sentences pooled into one corpus, nor a mean of sentence BLEUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from sacrebleu.metrics import BLEU, CHRF


def score(hyps: Sequence[str], refs: Sequence[str], bleu: BLEU, chrf: CHRF) -> dict:
  """Corpus BLEU and chrF++ of one language's detokenized hypotheses."""
  return {"bleu": bleu.corpus_score(list(hyps), [list(refs)]).score,
          "chrf": chrf.corpus_score(list(hyps), [list(refs)]).score, "sentences": len(refs)}


INTERVAL_SAMPLES, INTERVAL_SEED = 1000, 0  # 1,000 resamples of each of 112 languages: 2 s on 2 cores


def bleu_interval(hyps: Sequence[str], refs: Sequence[str], samples: int = INTERVAL_SAMPLES,
                  seed: int = INTERVAL_SEED) -> tuple[float, float]:
  """The 95% percentile-bootstrap interval of one language's corpus BLEU: the 2.5th and 97.5th percentiles of the
  BLEU of `samples` resamples (with replacement) of its sentences. sacrebleu's own sentence statistics and BLEU of
  their sums, so each resample is scored as `score` scores the corpus; a fixed seed gives the same interval again."""
  bleu = BLEU()
  stats = np.array(bleu._extract_corpus_statistics(list(hyps), [list(refs)]), np.int64)  # [sentences, 2 + 2 x 4]
  n = len(stats)
  times = np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n), size=samples)  # [samples, sentences]
  scores = [bleu._compute_score_from_stats(row.tolist()).score for row in times @ stats]
  low, high = np.percentile(scores, [2.5, 97.5])
  return float(low), float(high)


def by_language(hyps: Mapping[str, Sequence[str]], refs: Mapping[str, Sequence[str]]) -> tuple[dict, dict]:
  """({language: score(its hypotheses, its references)}, {'bleu', 'chrf': sacrebleu signature}); chrF++ is chrF
  with word bigrams (word_order=2)."""
  if hyps.keys() != refs.keys():
    raise ValueError(f"hypotheses and references name different languages: {sorted(hyps)} against {sorted(refs)}")
  bleu, chrf = BLEU(), CHRF(word_order=2)
  per_lang = {}
  for lang, lines in hyps.items():
    if len(lines) != len(refs[lang]):
      raise ValueError(f"{lang}: {len(lines)} hypotheses for {len(refs[lang])} references")
    per_lang[lang] = score(lines, refs[lang], bleu, chrf)
  return per_lang, {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())}


def mean_over_languages(per_lang: Mapping[str, Mapping], key: str) -> float | None:
  """The mean of `key` over the languages that have it (None when none has)."""
  values = [s[key] for s in per_lang.values() if key in s]
  return float(np.mean(values)) if values else None

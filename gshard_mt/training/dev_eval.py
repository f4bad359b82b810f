"""The dev evaluations during training: the loss on (some) dev batches, and the greedy BLEU of a fixed sample of
each language's dev pairs, scored as eval.py scores a split (`scoring`)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator

import flax.linen as nn
import jax
import numpy as np

from gshard_mt.config import row_lengths
from gshard_mt.data import packing, pipeline
from gshard_mt.errors import ConfigError
from gshard_mt.model import decode
from gshard_mt.model.transformer import Transformer
from gshard_mt.parallel import distributed, shardings
from gshard_mt.training import scoring
from gshard_mt.training.setup import Setup
from gshard_mt.training.step import eval_step


def loss_batches(split: packing.TokenizedSplit, config) -> Iterator[dict]:
  """The pairs of `split` that fit the training rows (`row_lengths`), one per row of [batch_size, row_lengths]
  batches, in a fixed mix of all languages (so that `eval_batches` caps no language out): the dev loss is taken
  on them, as the training loss is on the training pairs that fit (a longer pair, cut to fit, would be scored
  against an EOS its reference does not have)."""
  lengths = row_lengths(config)
  ids = pipeline.eligible(split, lengths).ids
  ids = ids[np.random.default_rng(0).permutation(len(ids))]
  return pipeline.eval_batches(split, config.batch_size, lengths[0], ids, lengths[1])


def evaluate_loss(setup: Setup, params, data: pipeline.Data, config) -> dict:
  """Token-level nll, perplexity and accuracy on (up to `config.eval_batches` batches of) the dev pairs that fit
  the training rows (`loss_batches`)."""
  step = jax.jit(functools.partial(eval_step, model=Transformer(setup.model_cfg, deterministic=True)))
  totals = np.zeros(3)
  with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
    for batch in itertools.islice(loss_batches(data.tokens["dev"], config), config.eval_batches or None):
      batch.pop("index")
      local = distributed.process_rows(batch)
      totals += np.array(jax.device_get(step(params, distributed.global_batch(local, setup.mesh, setup.rules))))
  nll = totals[0] / max(totals[2], 1)
  return {"dev_loss": nll, "dev_perplexity": float(np.exp(min(nll, 50))), "dev_accuracy": totals[1] / max(totals[2], 1)}


def language_sample(split: packing.TokenizedSplit, languages: list[str], per_language: int, max_sentences: int,
                    seed: int) -> dict[str, np.ndarray]:
  """{language: sorted positions of `per_language` of its pairs (all when it has fewer)}, drawn from `seed`; when
  that would give more than `max_sentences` pairs, only max_sentences // per_language languages (at least one), in
  an order drawn from `seed`. Languages without pairs are left out."""
  rng = np.random.default_rng(seed)
  sizes = {lang: len(pipeline.language_ids(split, lang)) for lang in sorted(languages)}
  order = [str(lang) for lang in rng.permutation(sorted(sizes)) if sizes[lang]]
  shuffled = {lang: rng.permutation(sizes[lang]) for lang in order}  # drawn for all: a cap keeps the others' draws
  if sum(min(sizes[lang], per_language) for lang in order) > max_sentences:
    order = order[:max(max_sentences // per_language, 1)]
  return {lang: np.sort(shuffled[lang][:per_language]) for lang in sorted(order)}


def evaluate_bleu(translator: decode.Translator, data: pipeline.Data, sample: dict[str, np.ndarray], rows: int,
                  max_length: int) -> dict:
  """Greedy translations of the sampled dev pairs, scored as eval.py scores a split: an estimate of
  `eval.py --split dev --beam_size 1`. `translator` holds the parameters to evaluate."""
  tokens = data.tokens["dev"]
  ids = {lang: pipeline.language_ids(tokens, lang)[positions] for lang, positions in sample.items()}
  order = np.concatenate(list(ids.values()))
  order = order[np.argsort(tokens.src_len[order], kind="stable")]  # similar lengths decode together
  out = {}
  # No partitioning rules while decoding, as in eval.py: XLA places the work from the parameters' shardings.
  with nn.logical_axis_rules(()):
    for batch in pipeline.eval_batches(tokens, rows, max_length, order):
      out.update(translator.by_pair(batch))
  hyps = {lang: [data.tokenizer.decode(out[int(i)]) for i in lang_ids] for lang, lang_ids in ids.items()}
  refs = {lang: [data.text["dev"][lang].tgt[k] for k in positions] for lang, positions in sample.items()}
  per_lang, _ = scoring.by_language(hyps, refs)
  return {"dev_bleu_greedy": scoring.mean_over_languages(per_lang, "bleu"),
          "dev_chrf_greedy": scoring.mean_over_languages(per_lang, "chrf"), "dev_bleu_sentences": len(order),
          "dev_bleu_languages": len(sample), "dev_bleu_per_language": max(map(len, sample.values()))}


class DevEvaluator:
  """The dev loss every `eval_every` steps, the greedy dev BLEU of a fixed sample every `eval_bleu_every` (one
  translator, compiled once), and both at the last step."""

  def __init__(self, config, setup: Setup, data: pipeline.Data, params):
    self.config, self.setup, self.data = config, setup, data
    if config.eval_every and not len(pipeline.eligible(data.tokens["dev"], row_lengths(config)).ids):
      # else the loss of no pair: 0.0, logged as if measured
      raise ConfigError("eval_every needs dev pairs that fit the training rows (data.max_length), and the dev split "
                        "has none: eval_every=0 turns the dev loss off")
    if config.eval_bleu_every:
      self.sample = language_sample(data.tokens["dev"], list(data.text["dev"]), config.eval_bleu_per_language,
                                    config.eval_bleu_sentences, config.seed)
      if not self.sample:
        raise ConfigError("eval_bleu_every needs dev pairs to translate, and the dev split is empty")
      self.translator = decode.Translator(setup.model_cfg, params, beam_size=1, max_len=config.data.max_length,
                                          batch_sharding=shardings.batch_sharding(setup.mesh, setup.rules),
                                          **data.tokenizer.decoding())

  def due(self, step: int, last: bool, *everies: int) -> bool:
    """Whether an evaluation every `everies` steps (default: the loss's or the BLEU's) is due at `step`."""
    everies = everies or (self.config.eval_every, self.config.eval_bleu_every)
    return any(n and (step % n == 0 or last) for n in everies)

  def __call__(self, step: int, params, last: bool) -> dict:
    """The dev metrics due at `step` ({} when none is)."""
    config = self.config
    dev = evaluate_loss(self.setup, params, self.data, config) if self.due(step, last, config.eval_every) else {}
    if self.due(step, last, config.eval_bleu_every):
      self.translator.params = params
      dev |= evaluate_bleu(self.translator, self.data, self.sample, config.batch_size, config.data.max_length)
    return dev

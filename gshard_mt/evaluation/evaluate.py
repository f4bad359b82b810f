"""Translation quality of a trained work directory: decode a split, score BLEU and chrF++ per language.

  python eval.py --workdir runs/tiny [--split test] [--beam_size 4] [--baseline runs/dense]

Writes workdir/eval/<split>-<step>/: hyp.<lang>.txt per language, scores.json, report.md and
bleu_by_language.png, into a temporary directory that is renamed into place only when complete.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest
from tqdm import tqdm

from gshard_mt import config as config_lib
from gshard_mt.data import pipeline
from gshard_mt.errors import WorkdirError
from gshard_mt.evaluation import decode, report
from gshard_mt.io import directory_atomically
from gshard_mt.training import checkpoint as checkpoint_lib

BUCKETS = ("high", "medium", "low")



def resource_buckets(train_pairs: dict[str, int]) -> dict[str, str]:
  """'high', 'medium' or 'low': the third of the languages a language falls in by training pairs, counting the
  languages with strictly more pairs (so languages with equal counts share a bucket)."""
  counts = sorted(train_pairs.values(), reverse=True)
  n = max(len(counts), 1)
  return {lang: BUCKETS[min(3 * counts.index(c) // n, 2)] for lang, c in train_pairs.items()}


def score(hyps: list[str], refs: list[str], bleu: BLEU, chrf: CHRF) -> dict:
  """Corpus BLEU and chrF++ of one language's detokenized hypotheses."""
  return {"bleu": bleu.corpus_score(hyps, [refs]).score, "chrf": chrf.corpus_score(hyps, [refs]).score,
          "sentences": len(refs)}


def paired_bootstrap(hyps: list[str], base_hyps: list[str], refs: list[str], samples: int) -> float:
  """sacrebleu's paired bootstrap resampling: p-value of the system's BLEU difference from the baseline's."""
  test = PairedTest([("baseline", base_hyps), ("system", hyps)], {"BLEU": BLEU()}, [refs], test_type="bs",
                    n_samples=samples)
  _, results = test()
  return float(results["BLEU"][1].p_value)


def _baseline_scores(baseline: pathlib.Path, split: str) -> dict:
  runs = sorted((baseline / "eval").glob(f"{split}-*/scores.json"), key=lambda p: int(p.parent.name.split("-")[1]))
  if not runs:
    raise WorkdirError(f"baseline {baseline} has no scores for the {split} split (run eval.py --workdir {baseline} "
                    f"--split {split} first)")
  return json.loads(runs[-1].read_text()) | {"path": str(runs[-1].parent)}


@dataclasses.dataclass
class Restored:
  """A trained work directory, ready to decode: its config, data, model setup and the parameters of one step."""

  workdir: pathlib.Path
  config: Any
  data: Any
  model_cfg: Any
  step: int
  params: Any
  averaged: tuple[int, ...] = ()  # the checkpoint steps whose parameters were averaged (empty: `step` alone)


def restore(workdir, *, step: int | None = None, split: str = "test", average_last: int | None = None) -> Restored:
  """Checks the work directory and restores the parameters of `step` (default: the newest checkpoint); with
  `average_last=N`, the mean parameters of the last N checkpoints up to and including `step`."""
  workdir = pathlib.Path(workdir)
  config = config_lib.load_saved(workdir)
  if split not in ("dev", "test"):
    raise WorkdirError(f"--split must be dev or test, got {split!r}")
  with checkpoint_lib.Checkpoints(workdir / "checkpoints") as ckpts:
    steps = ckpts.steps()
  if not steps:
    raise WorkdirError(f"{workdir}/checkpoints has no checkpoint: train first (python train.py ... --workdir "
                       f"{workdir})")
  averaged = steps_to_average(steps, step, average_last, workdir) if average_last is not None else ()
  data = pipeline.load(config, workdir)
  from gshard_mt.training.setup import build  # JAX-heavy; imported once the inputs have been checked

  setup = build(config, data.tokenizer.vocab_size)
  if averaged:
    params = average_params(_restore_state(workdir, setup.abstract_target(), s)[1].params for s in averaged)
    return Restored(workdir, config, data, setup.model_cfg, averaged[-1], params, averaged)
  step, state = _restore_state(workdir, setup.abstract_target(), step)
  return Restored(workdir, config, data, setup.model_cfg, step, state.params)


def _restore_state(workdir: pathlib.Path, abstract, step: int | None):
  """(step, train state) of `step` (default: the newest that restores), checkpoint problems as WorkdirError."""
  directory = workdir / "checkpoints"
  try:
    with checkpoint_lib.Checkpoints(directory) as ckpts:
      step, state, _ = ckpts.restore(abstract, step)
  except FileNotFoundError as e:
    raise WorkdirError(str(e)) from None
  except Exception as e:  # noqa: BLE001 - orbax reports shape mismatches in several ways
    raise WorkdirError(f"the checkpoint in {directory.resolve()} does not match {workdir}/config.json "
                       f"({type(e).__name__}: {str(e).splitlines()[0][:300]})") from None
  return step, state


def steps_to_average(steps: list[int], step: int | None, count: int, workdir) -> tuple[int, ...]:
  """The last `count` checkpoint steps up to and including `step` (default: the newest); WorkdirError when there
  are fewer."""
  if count < 1:
    raise WorkdirError(f"--average_last must be at least 1, got {count}")
  if step is not None and step not in steps:
    raise WorkdirError(f"no checkpoint for step {step} in {workdir}/checkpoints (have {steps})")
  upto = [s for s in steps if step is None or s <= step]
  if len(upto) < count:
    raise WorkdirError(f"--average_last {count} needs {count} checkpoints, but {workdir}/checkpoints has "
                       f"{len(upto)}{'' if step is None else f' up to step {step}'}: {upto}")
  return tuple(upto[-count:])


def average_params(trees: Iterable) -> Any:
  """The leaf-by-leaf mean of parameter trees (as fairseq's average_checkpoints.py): summed and divided in float32,
  then cast back to each leaf's dtype. Takes an iterable, so only the sum and one tree are held at a time."""
  total, dtypes, count = None, None, 0
  for tree in trees:
    as_f32 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)
    total = as_f32 if total is None else jax.tree.map(jnp.add, total, as_f32)
    dtypes, count = jax.tree.map(lambda x: x.dtype, tree), count + 1
  if not count:
    raise ValueError("average_params needs at least one tree")
  return jax.tree.map(lambda x, dtype: (x / count).astype(dtype), total, dtypes)


def decode_pairs(translator: decode.Translator, run: Restored, *, split: str, ids: np.ndarray, rows: int,
                 progress: bool = True) -> tuple[dict[int, str], dict]:
  """Translates the pairs `ids` of a split, similar lengths batched together (compiled before the clock starts);
  returns ({pair id: detokenized hypothesis}, {'seconds', 'sentences', 'tokens'})."""
  tokens = run.data.tokens[split]
  ids = ids[np.argsort(tokens.src_len[ids], kind="stable")]
  batches = list(pipeline.eval_batches(tokens, rows, run.config.data.max_length, ids))
  translator(batches[0])
  hyp_by_id, out_tokens = {}, 0
  start = time.perf_counter()
  for batch in tqdm(batches, desc=f"decode {split}", unit="batch", disable=not progress):
    for pair, seq in translator.by_pair(batch).items():
      hyp_by_id[pair] = run.data.tokenizer.decode(seq)
      out_tokens += len(seq) + 1
  return hyp_by_id, {"seconds": time.perf_counter() - start, "sentences": len(hyp_by_id), "tokens": out_tokens}


def score_languages(run: Restored, *, split: str, hyps: dict[str, list[str]], base: dict | None,
                    bootstrap_samples: int) -> tuple[dict, dict]:
  """Per language: BLEU, chrF++, resource bucket and, against a baseline, ΔBLEU (and a bootstrap p-value).
  Returns (per-language scores, sacrebleu signatures)."""
  train_pairs = {lang: len(run.data.text["train"][lang]) for lang in hyps}
  buckets = resource_buckets(train_pairs)
  per_lang, bleu, chrf = {}, BLEU(), CHRF(word_order=2)
  for lang, lines in hyps.items():
    refs = run.data.text[split][lang].tgt
    per_lang[lang] = score(lines, refs, bleu, chrf) | {"train_pairs": train_pairs[lang], "resource": buckets[lang]}
    if base and lang in base["languages"]:
      per_lang[lang]["delta_bleu"] = per_lang[lang]["bleu"] - base["languages"][lang]["bleu"]
      base_hyp_file = pathlib.Path(base["path"]) / f"hyp.{lang}.txt"
      if bootstrap_samples and base_hyp_file.exists():
        base_hyps = base_hyp_file.read_text().split("\n")[: len(refs)]
        per_lang[lang]["bootstrap_p"] = paired_bootstrap(lines, base_hyps, refs, bootstrap_samples)
  return per_lang, {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())}


def averages(per_lang: dict, base: dict | None) -> tuple[dict, dict]:
  """Macro averages over all languages and over each resource bucket (ΔBLEU too, against a baseline)."""
  keys = ("bleu", "chrf") + (("delta_bleu",) if base else ())

  def mean(scores, key):
    values = [s[key] for s in scores if key in s]
    return float(np.mean(values)) if values else None

  scores = list(per_lang.values())
  overall = {k: mean(scores, k) for k in keys}
  by_resource = {b: {k: mean([s for s in scores if s["resource"] == b], k) for k in keys}
                 for b in BUCKETS if any(s["resource"] == b for s in scores)}
  return overall, by_resource


def evaluate(workdir, *, split="test", step=None, beam_size=4, alpha=0.6, max_decode_len=None, languages=None,
             baseline=None, batch_size=None, bootstrap_samples=0, average_last=None) -> dict:
  """Decodes `split` with the checkpoint of `step` (default: the newest), or with the mean parameters of the last
  `average_last` checkpoints up to it, and writes the scores; returns them."""
  base = _baseline_scores(pathlib.Path(baseline), split) if baseline else None
  run = restore(workdir, step=step, split=split, average_last=average_last)
  tokens = run.data.tokens[split]
  wanted = languages or sorted(run.data.text[split])
  unknown = sorted(set(wanted) - set(tokens.languages))
  if unknown:
    raise WorkdirError(f"unknown language code(s) {unknown} for --languages; {workdir} has {tokens.languages}")
  max_len = max_decode_len or run.config.data.max_length
  rows = batch_size or run.config.batch_size
  translator = decode.Translator(run.model_cfg, run.params, beam_size, alpha, max_len)
  lang_ids = {lang: pipeline.language_ids(tokens, lang) for lang in wanted}
  hyp_by_id, speed = decode_pairs(translator, run, split=split, ids=np.concatenate(list(lang_ids.values())),
                                  rows=rows)
  hyps = {lang: [hyp_by_id[int(i)] for i in ids] for lang, ids in lang_ids.items()}
  per_lang, signatures = score_languages(run, split=split, hyps=hyps, base=base, bootstrap_samples=bootstrap_samples)
  overall, by_resource = averages(per_lang, base)
  scores = {
      "workdir": str(run.workdir), "split": split, "step": run.step, "languages": per_lang, "average": overall,
      "by_resource": by_resource, "signatures": signatures,
      "decoding": {"beam_size": beam_size, "alpha": alpha, "max_decode_len": max_len, "batch_size": rows,
                   "eval_capacity_factor": run.config.moe.eval_capacity_factor, "sentences": speed["sentences"],
                   "seconds": speed["seconds"], "sentences_per_s": speed["sentences"] / speed["seconds"],
                   "tokens_per_s": speed["tokens"] / speed["seconds"], "averaged_steps": list(run.averaged)},
  } | ({"baseline": base["path"]} if base else {})
  out_dir = run.workdir / "eval" / (f"{split}-{run.step}" + (f"-avg{len(run.averaged)}" if run.averaged else ""))
  _write_atomically(out_dir, scores, hyps)
  return scores | {"output_dir": str(out_dir)}


def _write_atomically(out_dir: pathlib.Path, scores: dict, hyps: dict):
  with directory_atomically(out_dir) as tmp:
    for lang, lines in hyps.items():
      (tmp / f"hyp.{lang}.txt").write_text("\n".join(lines) + "\n")
    (tmp / "scores.json").write_text(json.dumps(scores, indent=2))
    (tmp / "report.md").write_text(report.markdown(scores))
    report.plot(scores, tmp / "bleu_by_language.png")

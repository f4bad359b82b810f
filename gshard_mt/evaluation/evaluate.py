"""Translation quality of a trained work directory: decode a split, score BLEU and chrF++ per language.

  python eval.py --workdir runs/tiny [--split test] [--beam_size 4] [--baseline runs/dense]

Writes workdir/eval/<split>-<step>/ (hyp.<lang>.txt per language, scores.json, report.md, bleu_by_language.png)
whole or not at all; settings other than the standard evaluation's add to its name (`output_name`).
On several hosts every process decodes its rows of each batch; process 0 scores and writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest
from tqdm import tqdm

from gshard_mt import hints, io, lock
from gshard_mt.data import pipeline
from gshard_mt.errors import UserError, WorkdirError, close_matches, listed, one_line
from gshard_mt.evaluation import baseline as baseline_lib
from gshard_mt.evaluation import flags, report
from gshard_mt.evaluation.outputs import output_name
from gshard_mt.model import decode
from gshard_mt.parallel import distributed
from gshard_mt.parallel.shardings import batch_sharding
from gshard_mt.training import checkpoint as checkpoint_lib
from gshard_mt.training import scoring, validate
from gshard_mt.training.setup import build

log = logging.getLogger(__name__)

BUCKETS = ("high", "medium", "low")


def resource_buckets(train_pairs: dict[str, int]) -> dict[str, str]:
  """'high', 'medium' or 'low': the third of the languages a language falls in by training pairs, counting those
  with strictly more (so equal counts share a bucket)."""
  counts = sorted(train_pairs.values(), reverse=True)
  n = max(len(counts), 1)
  return {lang: BUCKETS[min(3 * counts.index(c) // n, 2)] for lang, c in train_pairs.items()}


def versus_baseline(bleu: float, base_bleu: float, hyps: list[str], base_hyps: list[str] | None, refs: list[str],
                    bootstrap_samples: int) -> dict:
  """One language against the baseline: ΔBLEU (the system's minus the baseline's) and, given the baseline's
  hypotheses and a number of samples, the p-value of sacrebleu's paired bootstrap resampling."""
  out = {"delta_bleu": bleu - base_bleu}
  if bootstrap_samples and base_hyps is not None:
    test = PairedTest([("baseline", base_hyps), ("system", hyps)], {"BLEU": BLEU()}, [refs], test_type="bs",
                      n_samples=bootstrap_samples)
    out["bootstrap_p"] = float(test()[1]["BLEU"][1].p_value)
  return out


def check_decoding_length(workdir, max_decode_len: int | None):
  """Reads the run's config.json (a directory that is not a run is refused here, before anything is created in it)
  and checks the decoding length against its positions (`decode.check_length`), before the data is read."""
  config = validate.load_saved(workdir)
  decode.check_length(config.model, max_decode_len or config.data.max_length)


@dataclasses.dataclass
class Restored:
  """A trained work directory ready to decode: its config, data, model and parameters, on the config's mesh."""

  workdir: epath.Path
  config: Any
  data: Any
  model_cfg: Any
  step: int
  params: Any
  averaged: tuple[int, ...] = ()  # the checkpoint steps whose parameters were averaged (empty: `step` alone)
  batch_sharding: Any = None  # the rows of a batch on the parameters' mesh (None: as they come, one process)

  def translator(self, beam_size: int, alpha: float, max_len: int) -> decode.Translator:
    """The Translator of these parameters, each process passing its rows of every batch."""
    return decode.Translator(self.model_cfg, self.params, beam_size, alpha, max_len, self.batch_sharding,
                             **self.data.tokenizer.decoding())


def restore(workdir, *, step: int | None = None, split: str = "test", average_last: int | None = None) -> Restored:
  """The parameters of `step` (default: the newest checkpoint), or with `average_last=N` the mean of the last N
  checkpoints' up to and including `step`."""
  workdir = io.path(workdir)
  config = validate.load_saved(workdir)
  if split not in ("dev", "test"):
    raise WorkdirError(f"--split must be dev or test, got {split!r}")
  with checkpoint_lib.Checkpoints(workdir / checkpoint_lib.FOLDER, read_only=True) as ckpts:
    steps = ckpts.steps()
  if not steps:
    train = hints.command({"--config": "<its config file>", "--workdir": str(workdir)}, program="train.py")
    raise WorkdirError(f"{workdir}/{checkpoint_lib.FOLDER} has no checkpoint: train first ({train})")
  if step is not None and step not in steps:  # before the data is read
    raise WorkdirError(f"no checkpoint for step {step} in {workdir}/{checkpoint_lib.FOLDER} (have {steps})")
  averaged = steps_to_average(steps, step, average_last, workdir) if average_last is not None else ()
  data = pipeline.load(config, workdir)
  setup = build(config, data.tokenizer)
  if averaged:
    params = average_params(restore_state(workdir, setup.abstract_target(), s)[1].params for s in averaged)
    step = averaged[-1]
  else:
    step, state = restore_state(workdir, setup.abstract_target(), step)
    params = state.params
  return Restored(workdir, config, data, setup.model_cfg, step, params, averaged,
                  batch_sharding(setup.mesh, setup.rules))


def restore_state(workdir: epath.Path, abstract, step: int | None):
  """(step, train state) of `step` (default: the newest that restores), checkpoint problems as WorkdirError."""
  directory = workdir / checkpoint_lib.FOLDER
  try:
    with checkpoint_lib.Checkpoints(directory, read_only=True) as ckpts:
      step, state, _ = ckpts.restore(abstract, step)
  except FileNotFoundError as e:
    raise WorkdirError(str(e)) from None
  except checkpoint_lib.RestoreError as e:  # none restores: its one line gives each step and why
    raise WorkdirError(f"{e}; they are unreadable or do not match {workdir}/config.json") from None
  except Exception as e:  # noqa: BLE001 - orbax reports unreadable files and shape mismatches in several ways
    raise WorkdirError(f"the checkpoint of step {step} in {io.absolute(directory)} cannot be restored: it is "
                       f"unreadable or does not match {workdir}/config.json ({one_line(e)})") from None
  return step, state


def steps_to_average(steps: list[int], step: int | None, count: int, workdir) -> tuple[int, ...]:
  """The last `count` of the checkpoint `steps` up to and including `step` (one of them, or None: the newest);
  WorkdirError when there are fewer (restore's callers need not have run `flags.check`)."""
  if count < 1:
    raise WorkdirError(f"--average_last must be at least 1, got {count}")
  upto = [s for s in steps if step is None or s <= step]
  if len(upto) < count:
    raise WorkdirError(f"--average_last {count} needs {count} checkpoints, but {workdir}/{checkpoint_lib.FOLDER} has "
                       f"{len(upto)}{'' if step is None else f' up to step {step}'}: {upto}")
  return tuple(upto[-count:])


def average_params(trees: Iterable) -> Any:
  """The leaf-by-leaf mean of parameter trees (as fairseq's average_checkpoints.py), in float32 and cast back; from
  an iterable, so only the sum and one tree are held at a time."""
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
  """({pair id: detokenized hypothesis}, {'seconds', 'sentences', 'tokens'}) of the pairs `ids` of a split, similar
  lengths batched together (compiled before the clock starts)."""
  tokens = run.data.tokens[split]
  ids = ids[np.argsort(tokens.src_len[ids], kind="stable")]
  batches = list(pipeline.eval_batches(tokens, rows, run.config.data.max_length, ids))
  translator(batches[0])
  hyp_by_id, out_tokens = {}, 0
  start = time.perf_counter()
  for batch in tqdm(batches, desc=f"decode {split}", unit="batch", disable=not progress or jax.process_index()):
    for pair, seq in translator.by_pair(batch).items():
      hyp_by_id[pair] = run.data.tokenizer.decode(seq)
      out_tokens += len(seq) + 1
  return hyp_by_id, {"seconds": time.perf_counter() - start, "sentences": len(hyp_by_id), "tokens": out_tokens}


def score_languages(run: Restored, *, split: str, hyps: dict[str, list[str]], base: dict | None,
                    bootstrap_samples: int) -> tuple[dict, dict]:
  """(per language: BLEU and its 95% interval, chrF++, resource bucket and, against a baseline, ΔBLEU and a
  bootstrap p-value; sacrebleu signatures)."""
  train_pairs = {lang: len(pairs) for lang, pairs in run.data.text["train"].items()}
  buckets = resource_buckets(train_pairs)  # among all the run's languages, whichever are evaluated
  refs = {lang: run.data.text[split][lang].tgt for lang in hyps}
  per_lang, signatures = scoring.by_language(hyps, refs)
  for lang, lines in hyps.items():
    per_lang[lang] |= {"train_pairs": train_pairs[lang], "resource": buckets[lang],
                       "references": baseline_lib.references_digest(refs[lang]),
                       "bleu_interval": list(scoring.bleu_interval(lines, refs[lang]))}
    if base and lang in base["languages"]:
      base_hyp_file = io.path(base["path"]) / f"hyp.{lang}.txt"
      read = bootstrap_samples and base_hyp_file.exists()
      base_hyps = base_hyp_file.read_text().split("\n")[: len(refs[lang])] if read else None
      per_lang[lang] |= versus_baseline(per_lang[lang]["bleu"], base["languages"][lang]["bleu"], lines, base_hyps,
                                        refs[lang], bootstrap_samples)
  return per_lang, signatures


def averages(per_lang: dict, base: dict | None) -> tuple[dict, dict]:
  """Macro averages over all languages and over each resource bucket (ΔBLEU too, against a baseline)."""
  keys = ("bleu", "chrf") + (("delta_bleu",) if base else ())
  overall = {k: scoring.mean_over_languages(per_lang, k) for k in keys}
  by_resource = {b: {k: scoring.mean_over_languages({lang: s for lang, s in per_lang.items() if s["resource"] == b}, k)
                     for k in keys}
                 for b in BUCKETS if any(s["resource"] == b for s in per_lang.values())}
  return overall, by_resource


def evaluated_languages(run: Restored, split: str, languages: list[str] | None) -> list[str]:
  """The languages to decode: `languages` (--languages), or every one with pairs in `split`; a WorkdirError for a
  code the run lacks, an asked language without pairs there, or a split with none (data.min_eval_pairs=0 can give
  a small language no dev or test pair)."""
  tokens, workdir = run.data.tokens[split], run.workdir
  unknown = sorted(set(languages or ()) - set(tokens.languages))
  if unknown:
    lister = hints.command({"--workdir": str(workdir), "--list_languages": True}, program="translate.py")
    raise WorkdirError(f"unknown language code(s) {unknown} for --languages; {close_matches(unknown, tokens.languages)}"
                       f"{workdir} has {listed(tokens.languages, 'languages', lister)}")
  empty = sorted(lang for lang, pairs in run.data.text[split].items() if not len(pairs.tgt))
  if languages and (asked := sorted(set(languages) & set(empty))):
    raise WorkdirError(f"--languages {','.join(asked)}: no {split} pairs in {workdir} (data.min_eval_pairs="
                       f"{run.config.data.min_eval_pairs} left them none)")
  wanted = languages or [lang for lang in sorted(run.data.text[split]) if lang not in empty]
  if not wanted:
    raise WorkdirError(f"the {split} split of {workdir} has no pairs to translate (data.{split}_fraction="
                       f"{getattr(run.config.data, split + '_fraction')}, data.min_eval_pairs="
                       f"{run.config.data.min_eval_pairs})")
  if empty and not languages:
    log.warning("left out, with no %s pairs: %s", split, ", ".join(empty))
  return wanted


def evaluate(workdir, *, split="test", step=None, beam_size=flags.BEAM_SIZE, alpha=flags.ALPHA, max_decode_len=None,
             languages=None, baseline=None, batch_size=None, bootstrap_samples=0, average_last=None) -> dict | None:
  """Decodes `split` with the checkpoint of `step` (default: the newest), or with the mean parameters of the last
  `average_last` checkpoints up to it, and writes the scores; returns them on process 0 (None on the others)."""
  flags.check(beam_size=beam_size, max_decode_len=max_decode_len, batch_size=batch_size, average_last=average_last,
              bootstrap=bootstrap_samples, alpha=alpha)
  if bootstrap_samples and not baseline:
    raise UserError(f"--bootstrap {bootstrap_samples} tests the difference to a baseline: it needs --baseline")
  base = distributed.checked_on_process_0(
      lambda: baseline_lib.newest_scores(io.path(baseline), split) if baseline else None)
  check_decoding_length(workdir, max_decode_len)
  # A directory that cannot be written is refused before the data is read (and created once the checkpoint restores).
  distributed.checked_on_process_0(
      lambda: io.check_writable(io.path(workdir) / "eval", "eval output directory", create=False))
  run = restore(workdir, step=step, split=split, average_last=average_last)
  tokens = run.data.tokens[split]
  wanted = evaluated_languages(run, split, languages)
  if base:  # before decoding
    baseline_lib.check_references(base, {lang: run.data.text[split][lang].tgt for lang in wanted}, split)
  max_len = max_decode_len or run.config.data.max_length
  rows = batch_size or run.config.batch_size
  subset = sorted(set(wanted)) if set(wanted) != set(run.data.text[split]) else None
  out_dir = run.workdir / "eval" / output_name(
      split, run.step, averaged=len(run.averaged), beam_size=beam_size, alpha=alpha, languages=subset,
      max_decode_len=max_len if max_len != run.config.data.max_length else None,
      batch_size=rows if rows != run.config.batch_size else None)
  distributed.checked_on_process_0(lambda: io.check_writable(out_dir.parent, "eval output directory"))
  with contextlib.ExitStack() as held:
    # One writer per output: a second eval.py of the same split and step is refused before it decodes.
    distributed.checked_on_process_0(lambda: held.enter_context(
        lock.hold(out_dir.parent, name=f".{out_dir.name}.lock")))
    lang_ids = {lang: pipeline.language_ids(tokens, lang) for lang in wanted}
    hyp_by_id, speed = decode_pairs(run.translator(beam_size, alpha, max_len), run, split=split,
                                    ids=np.concatenate(list(lang_ids.values())), rows=rows)
    if jax.process_index():
      return None
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
    with io.directory_atomically(out_dir) as tmp:
      for lang, lines in hyps.items():
        (tmp / f"hyp.{lang}.txt").write_text("\n".join(lines) + "\n")
      (tmp / "scores.json").write_text(json.dumps(scores, indent=2))
      (tmp / "report.md").write_text(report.markdown(scores))
      report.plot(scores, tmp / "bleu_by_language.png")
    return scores | {"output_dir": str(out_dir)}

"""Where an evaluation's results go in a work directory: eval/<split>-<step>/ for the standard evaluation, with a
part added for each setting that differs (`output_name`), and the standard evaluations a work directory holds
(`standard_evaluations`, which the sweep, the study and the plots read)."""

from __future__ import annotations

import hashlib

from etils import epath

from gshard_mt.evaluation import flags


def output_name(split: str, step: int, *, averaged: int = 0, beam_size: int = flags.BEAM_SIZE,
                alpha: float = flags.ALPHA, max_decode_len: int | None = None, languages: list[str] | None = None,
                batch_size: int | None = None) -> str:
  """The evaluation's folder in eval/: `<split>-<step>` for the standard one (one checkpoint, beam 4, alpha 0.6, the
  config's length and batch size, every language), and a part for each setting that differs (`test-600-beam1-fra`;
  the batch's sentences share the experts' capacity), so that no evaluation replaces one of other settings.
  `max_decode_len`, `batch_size`: where not the config's, else None; `languages`: a subset, else None."""
  parts = [split, str(step)]
  for differs, part in ((averaged, f"avg{averaged}"), (beam_size != flags.BEAM_SIZE, f"beam{beam_size}"),
                        (alpha != flags.ALPHA, f"alpha{alpha:g}"), (max_decode_len, f"len{max_decode_len}"),
                        (batch_size, f"bs{batch_size}")):
    parts += [part] if differs else []
  if languages:
    joined = "+".join(sorted(languages))
    digest = hashlib.sha1(joined.encode()).hexdigest()[:6]
    parts.append(joined if len(joined) <= 24 else f"{len(languages)}langs-{digest}")
  return "-".join(parts)


def standard_evaluations(workdir: epath.Path, split: str) -> dict[int, epath.Path]:
  """{step: its scores.json} of the standard evaluations of `split` in `workdir` (eval/<split>-<step>/)."""
  found = {p.parent.name.removeprefix(f"{split}-"): p for p in (workdir / "eval").glob(f"{split}-*/scores.json")}
  return dict(sorted((int(step), p) for step, p in found.items() if step.isdigit()))

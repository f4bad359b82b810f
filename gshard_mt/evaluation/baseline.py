"""The run that eval.py's --baseline names: its newest scores of a split, and the check that it was scored on the
same references as this run (ΔBLEU and its bootstrap over other sentences would mean nothing)."""

from __future__ import annotations

import hashlib
import json

from etils import epath

from gshard_mt import hints
from gshard_mt.errors import WorkdirError
from gshard_mt.evaluation.outputs import standard_evaluations


def newest_scores(baseline: epath.Path, split: str) -> dict:
  """The baseline's newest standard evaluation of `split`, else its newest of any settings."""
  if not baseline.is_dir():
    raise WorkdirError(f"--baseline {baseline}: no such directory")
  runs = list(standard_evaluations(baseline, split).values()) or sorted(
      (baseline / "eval").glob(f"{split}-*/scores.json"), key=lambda p: int(p.parent.name.split("-")[1]))
  if not runs:
    first = hints.command({"--workdir": str(baseline), "--split": split}, program="eval.py")
    raise WorkdirError(f"baseline {baseline} has no scores for the {split} split (evaluate it first: {first})")
  return json.loads(runs[-1].read_text()) | {"path": str(runs[-1].parent)}


def references_digest(refs: list[str]) -> str:
  """What scores.json keeps of a language's references, to tell whether two runs were scored on the same."""
  return hashlib.sha256("\n".join(refs).encode()).hexdigest()[:16]


def check_references(base: dict, refs: dict[str, list[str]], split: str):
  """A WorkdirError unless the baseline scored each language it shares with `refs` on the same references (their
  digest, or their number in older scores): ΔBLEU and its bootstrap over other sentences would mean nothing."""
  for lang, lines in refs.items():
    theirs, digest = base["languages"].get(lang), references_digest(lines)
    if theirs and (theirs["sentences"], theirs.get("references", digest)) != (len(lines), digest):
      raise WorkdirError(f"--baseline {base['path']}: its {lang} scores are over other {split} references than this "
                         f"run's ({theirs['sentences']} sentences against {len(lines)}): the corpora or splits differ")

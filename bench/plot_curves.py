"""Dev-loss curves of finished runs, against step and against wall-clock minutes, and their dev BLEU, in one
picture: of checkpoints that `eval.py --split dev --step N` has scored, else the greedy dev sample that training
logs with `eval_bleu_every`.

  python bench/plot_curves.py runs/sweeps/embedding/* --out bench/results/embedding.png [--title ...] [--no_time]

Reads each work directory's metrics.jsonl (the rows with a dev loss or dev BLEU) and eval/dev-<step>/scores.json,
and prints them as Markdown too. --no_time leaves out the minutes panel (for runs that shared a machine).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gshard_mt import io  # noqa: E402
from gshard_mt.tools import plot  # noqa: E402


def dev_rows(workdir) -> list[dict]:
  return [r for r in io.read_jsonl(workdir / "metrics.jsonl") if r.get("dev_loss") is not None]


def dev_bleu(workdir) -> tuple[list[tuple[int, float]], str]:
  """(step, average dev BLEU) of every scored checkpoint, by step, else of the greedy dev sample training logged;
  and which of the two it is."""
  scored = list(zip(*plot.dev_bleu(workdir)))
  if scored:
    return scored, "eval.py --split dev"
  rows = io.read_jsonl(workdir / "metrics.jsonl")
  return list(zip(*plot.series(rows, plot.greedy_sample(rows)[0]))), "greedy dev sample"


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("runs", nargs="+")
  parser.add_argument("--out", required=True, type=pathlib.Path)
  parser.add_argument("--title", default="")
  parser.add_argument("--no_time", action="store_true", help="no panel against wall-clock minutes")
  args = parser.parse_args()
  args.runs = [io.path(run) for run in args.runs]  # work directories, local or in object storage
  runs = {run.name: dev_rows(run) for run in args.runs}
  # older runs did not log wall_s
  timed = not args.no_time and all("wall_s" in r for rows in runs.values() for r in rows)
  bleu = {run.name: dev_bleu(run) for run in args.runs}  # name -> (points, where they come from)
  has_bleu = any(points for points, _ in bleu.values())
  panels = 1 + timed + has_bleu
  fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4), squeeze=False)
  by_step = axes[0][0]
  for name, rows in runs.items():
    by_step.plot([r["step"] for r in rows], [r["dev_loss"] for r in rows], marker="o", label=name)
    if timed:
      axes[0][1].plot([r["wall_s"] / 60 for r in rows], [r["dev_loss"] for r in rows], marker="o", label=name)
    print(f"| {name} | " + " | ".join(f"{r['step']}: {r['dev_loss']:.3f}" for r in rows) + " |")
  by_step.set(xlabel="training step", ylabel="dev loss (nats per token)", title=args.title or "dev loss")
  if timed:
    axes[0][1].set(xlabel="wall-clock minutes (evaluations included)", ylabel="dev loss", title="against time")
  if has_bleu:
    ax = axes[0][-1]
    for name, (points, _) in bleu.items():
      if points:
        ax.plot(*zip(*points), marker="s", label=name)
        print(f"| {name} dev BLEU | " + " | ".join(f"{step}: {b:.1f}" for step, b in points) + " |")
    kinds = sorted({kind for points, kind in bleu.values() if points})
    ax.set(xlabel="training step", ylabel="average dev BLEU", title="dev BLEU (" + "; ".join(kinds) + ")")
  for ax in axes[0]:
    ax.grid(alpha=0.3)
  by_step.legend(fontsize=8)
  fig.tight_layout()
  args.out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(args.out, dpi=110)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()

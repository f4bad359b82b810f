"""Dev-loss curves of finished runs, against step and against wall-clock minutes, and their dev BLEU where
`eval.py --split dev --step N` has scored checkpoints, in one picture.

  python bench/plot_curves.py runs/sweeps/embedding/* --out bench/results/embedding.png [--title ...]

Reads each work directory's metrics.jsonl (the rows with a dev loss) and eval/dev-<step>/scores.json, and prints
them as Markdown too.
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

from gshard_mt.tools import plot  # noqa: E402


def dev_rows(workdir: pathlib.Path) -> list[dict]:
  return [r for r in plot.read_jsonl(workdir / "metrics.jsonl") if r.get("dev_loss") is not None]


def dev_bleu(workdir: pathlib.Path) -> list[tuple[int, float]]:
  """(step, average dev BLEU) of every scored checkpoint, by step."""
  return list(zip(*plot.dev_bleu(workdir)))


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("runs", nargs="+", type=pathlib.Path)
  parser.add_argument("--out", required=True, type=pathlib.Path)
  parser.add_argument("--title", default="")
  args = parser.parse_args()
  runs = {run.name: dev_rows(run) for run in args.runs}
  timed = all("wall_s" in r for rows in runs.values() for r in rows)  # older runs did not log wall_s
  bleu = {run.name: dev_bleu(run) for run in args.runs}
  panels = 1 + timed + any(bleu.values())
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
  if any(bleu.values()):
    ax = axes[0][-1]
    for name, points in bleu.items():
      if points:
        ax.plot(*zip(*points), marker="s", label=name)
        print(f"| {name} dev BLEU | " + " | ".join(f"{step}: {b:.1f}" for step, b in points) + " |")
    ax.set(xlabel="training step", ylabel="average dev BLEU", title="dev BLEU (eval.py --split dev)")
  for ax in axes[0]:
    ax.grid(alpha=0.3)
  by_step.legend(fontsize=8)
  fig.tight_layout()
  args.out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(args.out, dpi=110)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()

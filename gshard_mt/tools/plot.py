"""Pictures of a training run, written into its work directory (train.py also writes them when it finishes).

  python -m gshard_mt.tools.plot runs/tiny

- `training.png`: training loss and dev loss, dev BLEU of the checkpoints eval.py scored on the dev split, the
  auxiliary load-balancing loss and the learning rate, against step;
- `routing.png`: one row per MoE layer: the expert load over training as a heatmap (experts x step; 1/E each
  when balanced) and, beside it, the fractions of top-1 and top-2 assignments dropped at capacity.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from gshard_mt import cli
from gshard_mt.errors import WorkdirError


def read_jsonl(path: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
  """(steps, values) of the rows that have `key`."""
  pairs = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
  return [p[0] for p in pairs], [p[1] for p in pairs]


def dev_bleu(workdir: pathlib.Path) -> tuple[list[int], list[float]]:
  """(steps, average BLEU) of the single-checkpoint dev evaluations (eval/dev-<step>/scores.json)."""
  scores = sorted((json.loads(p.read_text()) for p in (workdir / "eval").glob("dev-*/scores.json")
                   if p.parent.name.split("-")[1].isdigit()), key=lambda s: s["step"])
  return [s["step"] for s in scores], [s["average"]["bleu"] for s in scores]


def plot_training(workdir: pathlib.Path, rows: list[dict], plt) -> pathlib.Path:
  fig, axes = plt.subplots(1, 4, figsize=(18, 3.8))
  axes[0].plot(*series(rows, "loss"), label="training loss (label-smoothed)")
  axes[0].plot(*series(rows, "dev_loss"), marker="o", label="dev loss (NLL)")
  axes[0].set(xlabel="step", ylabel="nats per target token", title="loss")
  axes[0].legend(fontsize=8)
  steps, bleu = dev_bleu(workdir)
  axes[1].plot(steps, bleu, marker="s", color="tab:green")
  axes[1].set(xlabel="step", ylabel="average BLEU", title="dev BLEU")
  if not steps:
    axes[1].text(0.5, 0.5, "no scored checkpoint yet:\neval.py --split dev --step N", ha="center", va="center",
                 transform=axes[1].transAxes)
  axes[2].plot(*series(rows, "aux_loss"), color="tab:purple")
  moe_layers = len({k for r in rows for k in r if k.endswith("/load_cv")})
  axes[2].axhline(max(moe_layers, 1), color="grey", lw=0.8, ls="--", label="balanced")
  axes[2].set(xlabel="step", ylabel="sum over MoE layers (1 each when balanced)", title="auxiliary loss")
  axes[3].plot(*series(rows, "learning_rate"), color="tab:orange")
  axes[3].set(xlabel="step", ylabel="learning rate", title="learning rate")
  for ax in axes:
    ax.grid(alpha=0.3)
  fig.suptitle(str(workdir))
  fig.tight_layout()
  return _save(fig, workdir / "training.png", plt)


def plot_routing(workdir: pathlib.Path, rows: list[dict], loads: list[dict], plt) -> pathlib.Path | None:
  layers = sorted({k[: -len("/load")] for r in loads for k in r if k.endswith("/load")},
                  key=lambda name: ("decoder" in name, name))  # encoder layers first
  if not layers:
    return None
  fig, axes = plt.subplots(len(layers), 2, figsize=(13, 2.6 * len(layers)), squeeze=False,
                           gridspec_kw={"width_ratios": [3, 1]})
  steps = [r["step"] for r in loads]
  for (heat, drops), layer in zip(axes, layers):
    matrix = np.array([r[f"{layer}/load"] for r in loads]).T  # [E, steps]
    E = matrix.shape[0]
    image = heat.imshow(matrix * E, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest",
                        extent=(steps[0], steps[-1], -0.5, E - 0.5), vmin=0)
    fig.colorbar(image, ax=heat, label="load x E (1 = balanced)")
    heat.set(xlabel="step", ylabel="expert", title=f"{layer.removeprefix('moe/')}: expert load")
    heat.set_yticks(range(E) if E <= 16 else np.linspace(0, E - 1, 9).astype(int))
    for key, label in (("top1_dropped", "top-1 dropped"), ("top2_dropped", "top-2 dropped")):
      drops.plot(*series(rows, f"{layer}/{key}"), label=label)
    drops.set(xlabel="step", ylabel="fraction", title="dropped at capacity", ylim=(0, None))
    drops.grid(alpha=0.3)
    drops.legend(fontsize=8)
  fig.tight_layout()
  return _save(fig, workdir / "routing.png", plt)


def _save(fig, path: pathlib.Path, plt) -> pathlib.Path:
  tmp = path.with_name(f".{path.name}.tmp.png")  # atomic: a half-written picture never has the final name
  fig.savefig(tmp, dpi=100)
  plt.close(fig)
  tmp.replace(path)
  return path


def plot_run(workdir) -> list[pathlib.Path]:
  """Writes training.png (and routing.png for a MoE model) into the work directory; returns their paths."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  workdir = pathlib.Path(workdir)
  rows = read_jsonl(workdir / "metrics.jsonl")
  if not rows:
    raise WorkdirError(f"{workdir}/metrics.jsonl not found or empty: is {workdir} a trained work directory?")
  written = [plot_training(workdir, rows, plt)]
  routing = plot_routing(workdir, rows, read_jsonl(workdir / "expert_load.jsonl"), plt)
  return written + ([routing] if routing else [])


def main(argv):
  parser = cli.parser(__doc__)
  parser.add_argument("workdir")
  for path in plot_run(parser.parse_args(argv).workdir):
    print(f"wrote {path}")


if __name__ == "__main__":
  cli.run(main, prog="python -m gshard_mt.tools.plot")

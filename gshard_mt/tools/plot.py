"""Pictures of a training run, written into its work directory (train.py also writes them when it finishes), and
of a sweep, written beside its results table (the sweep also writes it).

  python -m gshard_mt.tools.plot runs/tiny
  python -m gshard_mt.tools.plot runs/sweeps/experts

- `training.png`: training loss and dev loss; dev BLEU and chrF++ of the training's greedy dev sample
  (`eval_bleu_every`) and BLEU of the checkpoints eval.py scored on the dev split; the auxiliary load-balancing loss
  and the learning rate, against step;
- `routing.png`: one row per MoE layer: the expert load over training as a heatmap (experts x step; 1/E each
  when balanced) and, beside it, the fractions of top-1 and top-2 assignments dropped at capacity;
- `results.png` (a sweep): final dev loss and BLEU (when evaluated) of each point against the swept config value,
  drawn from results.csv. A point without that value (the dense baseline of an experts sweep) is a dashed line;
  a sweep of several factors, or of words, puts its points side by side by name.
"""

from __future__ import annotations

import csv
import json
import math
from io import StringIO

import numpy as np
from etils import epath
from matplotlib.colors import TwoSlopeNorm

from gshard_mt import cli, figures, io
from gshard_mt import config as config_lib
from gshard_mt.config import defaults
from gshard_mt.errors import WorkdirError
from gshard_mt.evaluation import outputs


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
  """(steps, values) of the rows that have `key`."""
  pairs = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
  return [p[0] for p in pairs], [p[1] for p in pairs]


def curve(ax, rows: list[dict], key: str, **style) -> None:
  """The series of `key` as a line; a lone point (a run of one logged step) as a dot, which a line would not show."""
  xs, ys = series(rows, key)
  ax.plot(xs, ys, **({"marker": "o"} if len(xs) == 1 else {}) | style)


def dev_bleu(workdir: epath.Path) -> tuple[list[int], list[float]]:
  """(steps, average BLEU) of the standard dev evaluations (eval/dev-<step>/scores.json)."""
  scores = outputs.standard_evaluations(workdir, "dev")
  return list(scores), [json.loads(p.read_text())["average"]["bleu"] for p in scores.values()]


def greedy_sample(rows: list[dict]) -> tuple[str, str, str]:
  """(BLEU key, chrF++ key, words for the sample) of the greedy dev sample that training logged: per language
  (`dev_bleu_greedy`), or in runs logged before it a few sentences spread over the languages (`dev_bleu`)."""
  last = next((r for r in reversed(rows) if r.get("dev_bleu_greedy") is not None), None)
  if last:
    return ("dev_bleu_greedy", "dev_chrf_greedy",
            f"{last['dev_bleu_per_language']:.0f} sentences x {last['dev_bleu_languages']:.0f} languages")
  sample = max((r.get("dev_bleu_sentences") or 0 for r in rows), default=0)
  return "dev_bleu", "dev_chrf", f"{sample:.0f}-sentence sample"


def plot_training(workdir: epath.Path, rows: list[dict]) -> epath.Path:
  fig, axes = figures.subplots(1, 4, figsize=(18, 3.8))
  curve(axes[0], rows, "loss", label="training loss (label-smoothed)")
  axes[0].plot(*series(rows, "dev_loss"), marker="o", label="dev loss (NLL)")
  axes[0].set(xlabel="step", ylabel="nats per target token", title="loss")
  axes[0].legend(fontsize=8)
  bleu_key, chrf_key, sample = greedy_sample(rows)
  curves = [(series(rows, bleu_key), dict(color="tab:green", label=f"BLEU, greedy, {sample}")),
            (series(rows, chrf_key), dict(color="tab:olive", ls="--", label="chrF++, same sample")),
            (dev_bleu(workdir), dict(color="tab:blue", marker="s", ms=6, label="BLEU, eval.py (whole dev split)"))]
  for (steps, values), style in curves:
    if steps:
      axes[1].plot(steps, values, **({"marker": "o", "ms": 3} | style))
  axes[1].set(xlabel="step", ylabel="average over languages", title="dev BLEU and chrF++")
  if axes[1].lines:
    axes[1].legend(fontsize=8)
  else:
    axes[1].text(0.5, 0.5, "not evaluated: train with\n--config.eval_bleu_every=N, or run\n"
                 "eval.py --split dev --step N", ha="center", va="center", transform=axes[1].transAxes)
  curve(axes[2], rows, "aux_loss", color="tab:purple")
  moe_layers = len({k for r in rows for k in r if k.endswith("/load_cv")})
  axes[2].axhline(max(moe_layers, 1), color="grey", lw=0.8, ls="--", label="balanced")
  axes[2].set(xlabel="step", ylabel="sum over MoE layers (1 each when balanced)", title="auxiliary loss")
  curve(axes[3], rows, "learning_rate", color="tab:orange")
  axes[3].set(xlabel="step", ylabel="learning rate", title="learning rate")
  for ax in axes:
    ax.grid(alpha=0.3)
  fig.suptitle(str(workdir))
  fig.tight_layout()
  return figures.save(fig, workdir / "training.png")


def load_norm(matrices: list[np.ndarray]):
  """The one colour scale of every layer's heatmap of load x E: white at 1 (balanced), blue below it down to 0 (an
  idle expert), red above it up to the largest value of any layer (at least 2), so a colour means the same load in
  every row."""
  return TwoSlopeNorm(vcenter=1.0, vmin=0.0, vmax=max([2.0] + [float(m.max()) for m in matrices if m.size]))


def plot_routing(workdir: epath.Path, rows: list[dict], loads: list[dict]) -> epath.Path | None:
  fig = routing_figure(rows, loads)
  return None if fig is None else figures.save(fig, workdir / "routing.png")


def routing_figure(rows: list[dict], loads: list[dict]):
  """routing.png's figure (None without MoE layers): a row per MoE layer, its heatmap of load x E on the scale
  that every layer shares (`load_norm`, one colour bar), and its fractions dropped at capacity."""
  layers = sorted({k[: -len("/load")] for r in loads for k in r if k.endswith("/load")},
                  key=lambda name: ("decoder" in name, name))  # encoder layers first
  if not layers:
    return None
  fig, axes = figures.subplots(len(layers), 2, figsize=(13, 2.6 * len(layers) + 0.6), squeeze=False,
                           gridspec_kw={"width_ratios": [3, 1]}, layout="constrained")
  steps = [r["step"] for r in loads]
  matrices = [np.array([r[f"{layer}/load"] for r in loads]).T * len(loads[0][f"{layer}/load"])  # [E, steps]
              for layer in layers]
  norm = load_norm(matrices)
  # each column spans halfway to its neighbours' steps, so logged steps at uneven intervals (a preemption's save, a
  # changed log_every) are drawn where they were
  middles = [(a + b) / 2 for a, b in zip(steps, steps[1:])]
  edges = [2 * steps[0] - middles[0], *middles, 2 * steps[-1] - middles[-1]] if middles else [steps[0] - 0.5,
                                                                                               steps[0] + 0.5]
  for (heat, drops), layer, matrix in zip(axes, layers, matrices):
    E = matrix.shape[0]
    image = heat.pcolormesh(edges, np.arange(E + 1) - 0.5, matrix, cmap="RdBu_r", norm=norm)
    heat.set(xlabel="step", ylabel="expert", title=f"{layer.removeprefix('moe/')}: expert load")
    heat.set_yticks(range(E) if E <= 16 else np.linspace(0, E - 1, 9).astype(int))
    for key, label in (("top1_dropped", "top-1 dropped"), ("top2_dropped", "top-2 dropped")):
      curve(drops, rows, f"{layer}/{key}", label=label)
    drops.set(xlabel="step", ylabel="fraction", title="dropped at capacity", ylim=(0, None))
    drops.grid(alpha=0.3)
    drops.legend(fontsize=8)
  fig.colorbar(image, ax=axes[:, 0].tolist(), location="left", pad=0.01, aspect=12 * len(layers),
               label="load x E (1 = balanced; the same scale in every layer)")
  return fig


def read_results(path: epath.Path) -> list[dict]:
  """The rows of a sweep's results.csv, numbers as floats (names stay text) and empty cells as None."""

  def value(text: str):
    if text == "":
      return None
    try:
      return float(text)
    except ValueError:
      return text

  return [{k: v if k == "name" else value(v) for k, v in row.items()}
          for row in csv.DictReader(StringIO(path.read_text()))]


def swept_key(rows: list[dict]) -> str | None:
  """The config key a sweep varies: of the config keys with different values across the rows, the one set in the
  most rows, when that is more than half of them and no other is set in as many; else None (several factors)."""
  keys = set(config_lib.flatten(defaults.get_config()))
  columns = dict.fromkeys(k for r in rows for k in r)
  varying = [k for k in columns if k in keys and len({str(r.get(k)) for r in rows}) > 1]
  counts = sorted(((sum(r.get(k) is not None for r in rows), k) for k in varying), reverse=True)
  if counts and 2 * counts[0][0] > len(rows) and (len(counts) == 1 or counts[1][0] < counts[0][0]):
    return counts[0][1]
  return None


def _number(value) -> bool:
  return isinstance(value, float) and math.isfinite(value)


def plot_sweep(root: epath.Path) -> epath.Path:
  """results.png beside a sweep's results.csv: dev loss and, when any point was evaluated, BLEU per point."""
  rows = read_results(root / "results.csv")
  key = swept_key(rows)
  numeric = key is not None and any(_number(r[key]) for r in rows)
  metrics = [("dev_loss", "final dev loss (NLL)", ".3f")] + (
      [("bleu", "average BLEU (eval.py)", ".3g")] if any(r.get("bleu") is not None for r in rows) else [])
  fig, axes = figures.subplots(1, 2, figsize=(12, 4.2))
  for ax, (metric, label, fmt) in zip(axes, metrics):
    if numeric:  # points at their value; those without a number (a dense baseline) as dashed lines
      points = sorted((r[key], r[metric]) for r in rows if _number(r[key]) and r[metric] is not None)
      xs = [x for x, _ in points]
      ax.plot(xs, [y for _, y in points], marker="o")
      if xs and min(xs) > 0 and max(xs) >= 8 * min(xs):
        ax.set_xscale("log", base=2)
      ax.set_xticks(xs, [f"{x:g}" for x in xs])
      ax.minorticks_off()
      for i, r in enumerate(r for r in rows if not _number(r[key]) and r[metric] is not None):
        ax.axhline(r[metric], ls="--", color=f"C{i + 1}", label=f"{r['name']} ({r[metric]:{fmt}})")
      if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
      ax.set_xlabel(key)
    else:  # categories: one point per sweep point, by name (or by the swept word)
      names = [r["name"] if key is None or r[key] is None else f"{r[key]:g}" if _number(r[key]) else str(r[key])
               for r in rows]
      points = [(i, r[metric]) for i, r in enumerate(rows) if r[metric] is not None]
      ax.plot([i for i, _ in points], [y for _, y in points], "o")
      ax.set_xticks(range(len(rows)), names, rotation=30 if len(rows) > 4 else 0, ha="right" if len(rows) > 4 else
                    "center", fontsize=8)
      ax.set_xlabel(key or "sweep point")
    xs, ys = zip(*points) if points else ((), ())
    for x, y in zip(xs, ys):
      ax.annotate(f"{y:{fmt}}", (x, y), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=7)
    ax.set(ylabel=label, title=label)
    ax.margins(y=0.12)  # room for the value labels
    ax.grid(alpha=0.3)
  if len(metrics) == 1:
    axes[1].text(0.5, 0.5, "no BLEU: run the sweep with --eval\n(make sweep ARGS=--eval)", ha="center", va="center",
                 transform=axes[1].transAxes)
    axes[1].set(title="average BLEU (eval.py)", xticks=[], yticks=[])
  fig.suptitle(f"{root}: " + (f"sweep over {key}" if key else f"{len(rows)} sweep points"))
  fig.tight_layout()
  return figures.save(fig, root / "results.png")


def plot_run(workdir: io.PathLike) -> list[epath.Path]:
  """Writes training.png (and routing.png for a MoE model) into a work directory, or results.png into a sweep's
  root directory; returns their paths."""
  workdir = io.path(workdir)
  rows = io.read_jsonl(workdir / "metrics.jsonl")
  if not rows and (workdir / "results.csv").exists():
    return [plot_sweep(workdir)]
  if not rows:
    raise WorkdirError(f"{workdir}/metrics.jsonl not found or empty: is {workdir} a trained work directory (or a "
                       "sweep's, with results.csv)?")
  written = [plot_training(workdir, rows)]
  routing = plot_routing(workdir, rows, io.read_jsonl(workdir / "expert_load.jsonl"))
  return written + ([routing] if routing else [])


def main(argv):
  parser = cli.parser(__doc__)
  parser.add_argument("workdir")
  for path in plot_run(parser.parse_args(argv).workdir):
    print(f"wrote {path}")


if __name__ == "__main__":
  cli.run(main)

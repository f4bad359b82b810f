"""The upcycling study (issue 52): is a dense model's MoE upcycling (Komatsuzaki et al. 2023) worth its extra steps?

  make upcycle-study     # = python -m gshard_mt.tools.upcycle_study --config configs/routers.py
  python -m gshard_mt.tools.upcycle_study [--config configs/routers.py] [--dense_steps 800] [--extra_steps 800]
      [--seeds 0,1] [--root runs/upcycle] [--report_dir bench/results/upcycling] [-- extra train.py arguments]

On the config (by default the router study's Multi30k model: its MoE layers' hidden width equals its dense FFNs'),
per seed s, in --root: `dense_s<s>` (model.moe_interval=0) trained N = --dense_steps steps; then for M =
--extra_steps more: `continued_s<s>`, the dense model trained on (init_from, a fresh optimizer), `upcycled_s<s>`,
its MoE upcycled (init_from: every expert a copy of the dense FFN, the router fresh, a fresh optimizer), and
`scratch_s<s>`, the MoE trained from scratch for N + M steps. Each arm's last checkpoint is decoded on the test
split (eval.py). Writes into --report_dir report.json (its date, device and command, which bench/report.py renders
into docs/performance.md; per arm and seed: the test BLEU per language and on average, the dev-loss curve on the
total-steps axis) and dev_loss.png (the curves, the continued arms from step N).
Finished runs are neither trained nor decoded again.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex

import jax

from gshard_mt import cli, figures, io
from gshard_mt.evaluation import outputs
from gshard_mt.tools import sweep as sweep_lib
from gshard_mt.training import checkpoint as checkpoint_lib

ARMS = ("dense", "continued", "upcycled", "scratch")


def plan(root, dense_steps: int, extra_steps: int, seed: int) -> list[tuple[dict, int]]:
  """[(the run as a sweep point: name and config keys, its offset on the total-steps axis)] of one seed, in the
  order they train (the dense one first: the others start from it)."""
  dense = f"dense_s{seed}"
  start = {"init_from": str(root / dense)}
  return [({"name": dense, "seed": seed, "model.moe_interval": 0, "num_train_steps": dense_steps}, 0),
          ({"name": f"continued_s{seed}", "seed": seed, "model.moe_interval": 0, "num_train_steps": extra_steps,
            **start}, dense_steps),
          ({"name": f"upcycled_s{seed}", "seed": seed, "num_train_steps": extra_steps, **start}, dense_steps),
          ({"name": f"scratch_s{seed}", "seed": seed, "num_train_steps": dense_steps + extra_steps}, 0)]


def run_arm(base: str, workdir, point: dict, extra: list[str]):
  """Trains the run unless its last checkpoint exists, then decodes that checkpoint's test split once."""
  steps = point["num_train_steps"]
  if not (workdir / checkpoint_lib.FOLDER / str(steps)).exists():
    sweep_lib.run(sweep_lib.command(base, workdir, point, extra), point["name"])
  if steps not in outputs.standard_evaluations(workdir, "test"):
    sweep_lib.run(sweep_lib.eval_command(workdir, "--step", str(steps)), point["name"])


def summary(workdir, point: dict, offset: int) -> dict:
  """One finished run: its arm, seed, test BLEU (per language, average) and dev-loss curve [(total step, loss)]."""
  scores = json.loads(outputs.standard_evaluations(workdir, "test")[point["num_train_steps"]].read_text())
  curve = [(r["step"] + offset, r["dev_loss"]) for r in io.read_jsonl(workdir / "metrics.jsonl") if "dev_loss" in r]
  return {"name": point["name"], "arm": point["name"].rsplit("_s", 1)[0], "seed": point["seed"],
          "bleu": {lang: s["bleu"] for lang, s in scores["languages"].items()},
          "average_bleu": scores["average"]["bleu"], "curve": curve}


def plot(runs: list[dict], path):
  """The dev-loss curves of every run, one colour an arm, on the total-steps axis."""
  fig, ax = figures.subplots(figsize=(7, 4.5), layout="constrained")
  colours = dict(zip(ARMS, ("0.4", "tab:blue", "tab:red", "tab:green")))
  for r in runs:
    steps, losses = zip(*r["curve"]) if r["curve"] else ((), ())
    ax.plot(steps, losses, color=colours[r["arm"]], linestyle="-" if r["seed"] == runs[0]["seed"] else "--",
            label=f"{r['arm']} (seed {r['seed']})")
  ax.set_xlabel("total training steps")
  ax.set_ylabel("dev loss")
  ax.legend(fontsize=8)
  figures.save(fig, path)


def main(argv):
  parser = cli.parser(__doc__)
  parser.add_argument("--config", default="configs/routers.py")
  parser.add_argument("--dense_steps", type=int, default=800)
  parser.add_argument("--extra_steps", type=int, default=800)
  parser.add_argument("--seeds", default="0,1")
  parser.add_argument("--root", default="runs/upcycle")
  parser.add_argument("--report_dir", default="bench/results/upcycling")
  args, extra = parser.parse_known_args(argv)
  extra = [a for a in extra if a != "--"]
  root, out = io.path(args.root), io.path(args.report_dir)
  runs = []
  for seed in map(int, args.seeds.split(",")):
    for point, offset in plan(root, args.dense_steps, args.extra_steps, seed):
      run_arm(args.config, root / point["name"], point, extra)
      runs.append(summary(root / point["name"], point, offset))
  out.mkdir(parents=True, exist_ok=True)
  io.write_atomically(out / "report.json", json.dumps({  # with its provenance: bench/report.py renders it
      "date": datetime.date.today().isoformat(), "device": f"{jax.devices()[0].device_kind} ({os.cpu_count()} cores)",
      "jax": jax.__version__, "command": "python -m gshard_mt.tools.upcycle_study " + shlex.join(argv),
      "upcycling": {"config": args.config, "dense_steps": args.dense_steps, "extra_steps": args.extra_steps,
                    "extra": extra, "runs": runs}}, indent=2))
  plot(runs, out / "dev_loss.png")
  for r in runs:
    print(f"{r['name']}: test BLEU {r['average_bleu']:.2f}, last dev loss {r['curve'][-1][1] if r['curve'] else '-'}")
  print(f"wrote {out}/report.json, dev_loss.png")


if __name__ == "__main__":
  cli.run(main)

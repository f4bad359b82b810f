"""Runs a sweep: one training run per point, each in its own work directory, then a results table.

  python -m gshard_mt.tools.sweep --sweep configs/sweeps/experts.py [--root runs/sweeps/experts] [--print_only]
                            [--eval] [--jobs N] [-- extra train.py arguments applied to every point]

A sweep file defines BASE (a config file) and get_sweep() -> list of {'name': ..., 'config.key': value, ...}.
Points already finished are not run again (their work directory resumes at the last step). With --jobs N, N points
run at once, sharing the machine's GPUs or CPUs (each point's output goes to <point>/sweep.log). Writes results.csv,
results.md and results.png (dev loss and BLEU against the swept value; redraw with python -m gshard_mt.tools.plot).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import pathlib
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from io import StringIO

import jax
import numpy as np
from etils import epath

from gshard_mt import cli, config_files, io
from gshard_mt import config as config_lib
from gshard_mt.errors import ConfigError
from gshard_mt.evaluation import outputs
from gshard_mt.model.transformer import Transformer, TransformerConfig, dummy_batch
from gshard_mt.tools import plot
from gshard_mt.training import validate

ROOT = pathlib.Path(__file__).resolve().parents[2]


def count_params(config, vocab_size: int | None = None) -> int:
  """Parameters of the model a config describes, from shapes alone (nothing is allocated)."""
  cfg = TransformerConfig.from_config(config, vocab_size or config.data.vocab_size)
  shapes = jax.eval_shape(lambda: Transformer(cfg).init(jax.random.key(0), dummy_batch(1, 8)))
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(shapes)))


def load_sweep(path: pathlib.Path) -> tuple[str, list[dict]]:
  """(the base config file, the points) of a sweep file, each point's overrides checked against the base."""
  module = config_files.load_module(path, "get_sweep")
  if not isinstance(getattr(module, "BASE", None), str):
    raise ConfigError(f"{path} has no BASE, the config file its points change (e.g. BASE = 'configs/tiny.py')")
  points = config_files.run_file_code(path, module.get_sweep)
  names = [p.get("name") for p in points]
  if None in names or len(set(names)) != len(names):
    raise ConfigError(f"{path}: every sweep point needs a unique 'name', got {names}")
  for p in points:  # a bad key fails here, before anything runs
    try:
      planned(module.BASE, p, [])
    except ConfigError as e:
      raise ConfigError(f"{path}, point {p['name']!r}: {e}") from None
  return module.BASE, points


def overrides(point: dict) -> dict[str, str]:
  """The point's config keys as `--config.key=value` texts."""
  return {k: "inf" if isinstance(v, float) and math.isinf(v) else str(v) for k, v in point.items() if k != "name"}


def command(base: str, workdir: epath.Path, point: dict, extra: list[str]) -> list[str]:
  return [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / base), "--workdir", str(workdir),
          *(f"--config.{k}={v}" for k, v in overrides(point).items()), *extra]


def planned(base: str, point: dict, extra: list[str]):
  """The point's config as train.py runs it: the base file, the point's keys, then `extra`'s --config overrides."""
  return cli.load(ROOT / base, overrides(point) | config_lib.split_overrides(extra)[1])


def summarize(workdir: epath.Path, point: dict) -> dict:
  """Parameters, final dev loss, tokens/s and (if its final step is evaluated) average BLEU of one finished
  point."""
  row = {"name": point["name"], **{k: v for k, v in point.items() if k != "name"}}
  config = validate.load_saved(workdir)
  row["parameters"] = count_params(config)
  metrics = io.read_jsonl(workdir / "metrics.jsonl")
  dev = [m for m in metrics if "dev_loss" in m]
  train_rows = [m for m in metrics if "tokens_per_s" in m]
  row["step"] = max((m["step"] for m in metrics), default=0)
  row["dev_loss"] = dev[-1]["dev_loss"] if dev else None
  row["tokens_per_s"] = train_rows[-1]["tokens_per_s"] if train_rows else None
  scores = outputs.standard_evaluations(workdir, "test").get(row["step"])  # of the final step, not an earlier one
  row["bleu"] = json.loads(scores.read_text())["average"]["bleu"] if scores else None
  return row


def cell(value) -> str:
  """A value as results.md shows it: counts with thousands separators, losses and scores to 3 decimals (so that
  3.000 does not read as 3), small settings such as learning rates in 3 significant digits; '-' for none."""
  if value is None:
    return "-"
  if isinstance(value, bool) or not isinstance(value, int | float):
    return str(value)
  if abs(value) >= 1000 or isinstance(value, int):
    return f"{value:,.0f}"
  return f"{value:.3f}" if value == 0 or abs(value) >= 0.01 else f"{value:.3g}"


def write_tables(rows: list[dict], root: epath.Path):
  keys = list(dict.fromkeys(k for r in rows for k in r))
  table = StringIO(newline="")
  writer = csv.DictWriter(table, keys)
  writer.writeheader()
  writer.writerows(rows)
  io.write_atomically(root / "results.csv", table.getvalue())
  lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
  lines += ["| " + " | ".join(cell(r.get(k)) for k in keys) + " |" for r in rows]
  io.write_atomically(root / "results.md", "\n".join(lines) + "\n")
  return "\n".join(lines)


def eval_command(workdir: epath.Path, *args: str) -> list[str]:
  """eval.py on a point's work directory (test split unless `args` say otherwise)."""
  return [sys.executable, str(ROOT / "eval.py"), "--workdir", str(workdir), *args]


def run(cmd: list[str], name: str, log: epath.Path | None = None):
  """Runs one command of a point. With a `log` (points running at once), its output is appended there, after the
  same header line the terminal gets, and the process allocates accelerator memory as it needs it rather than
  JAX's 75% of it (unless the environment says otherwise). A log in object storage, which has no append, gets
  the output when the command ends."""
  header = f"== {name}: {shlex.join(cmd)}"
  sys.stdout.write(header + (f" (output: {log})" if log else "") + "\n")  # one write: threads do not interleave it
  sys.stdout.flush()
  if log is None:
    subprocess.run(cmd, check=True)
    return
  log.parent.mkdir(parents=True, exist_ok=True)
  io.append(log, header + "\n")
  env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", **os.environ}
  if io.is_local(log):
    with log.open("a") as out:
      subprocess.run(cmd, check=True, stdout=out, stderr=subprocess.STDOUT, env=env)
    return
  done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
  io.append(log, done.stdout)
  done.check_returncode()


def run_points(points: list[dict], run_point: Callable[[dict, epath.Path | None], None], root: epath.Path,
               jobs: int):
  """`run_point(point, log)` for every point, `jobs` at a time, each logging to <root>/<point>/sweep.log when more
  than one runs (their processes share the accelerators; GPUs and CPUs allow that, a TPU host one process only).
  The first failure stops the sweep: running points finish, queued ones do not start, and the error names the
  failed point's log. A root that cannot be created or written ends the sweep before any point starts."""
  io.check_writable(root, "sweep root")
  if jobs == 1:
    for point in points:
      run_point(point, None)
    return
  logs = {point["name"]: root / point["name"] / "sweep.log" for point in points}
  failed = threading.Event()  # checked as each point starts: a freed worker would otherwise take the next one

  def guarded(point: dict):
    if failed.is_set():
      return
    try:
      run_point(point, logs[point["name"]])
    except BaseException:
      failed.set()
      raise

  with ThreadPoolExecutor(jobs) as pool:  # leaving it waits for the points still running
    futures = {pool.submit(guarded, point): point["name"] for point in points}
    for future in as_completed(futures):
      if future.exception() is not None:
        name = futures[future]
        raise RuntimeError(f"sweep point {name!r} failed ({future.exception()}); its output: {logs[name]}")


def parser(doc: str) -> argparse.ArgumentParser:
  """The arguments every command over a sweep takes: --sweep, --root and --jobs."""
  p = cli.parser(doc)
  p.add_argument("--sweep", required=True)
  p.add_argument("--root", default=None, help="default: runs/sweeps/<sweep file name>")
  p.add_argument("--jobs", type=int, default=1, help="points run at once (default 1)")
  return p


def parse(p: argparse.ArgumentParser, argv: list[str]):
  """(parsed arguments, base config, points, root, train.py arguments given after '--')."""
  extra = argv[argv.index("--") + 1:] if "--" in argv else []
  args = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
  if args.jobs < 1:
    raise ConfigError(f"--jobs must be at least 1, got {args.jobs}")
  sweep = pathlib.Path(args.sweep)
  base, points = load_sweep(sweep)
  return args, base, points, io.path(args.root or ROOT / "runs" / "sweeps" / sweep.stem), extra


def main(argv):
  p = parser(__doc__)
  p.add_argument("--print_only", action="store_true", help="print the commands instead of running them")
  p.add_argument("--eval", action="store_true", help="also run eval.py (test split) on each point")
  args, base, points, root, extra = parse(p, argv)
  if args.print_only:
    for point in points:
      print(shlex.join(command(base, root / point["name"], point, extra)))
    return

  def run_point(point: dict, log: epath.Path | None):
    workdir = root / point["name"]
    run(command(base, workdir, point, extra), point["name"], log)
    if args.eval:
      run(eval_command(workdir), point["name"], log)

  run_points(points, run_point, root, args.jobs)
  rows = [summarize(root / point["name"], point) for point in points]
  if rows:
    root.mkdir(parents=True, exist_ok=True)
    print(write_tables(rows, root))
    print(f"wrote {root}/results.csv, results.md and {plot.plot_run(root)[0].name}")


if __name__ == "__main__":
  cli.run(main)

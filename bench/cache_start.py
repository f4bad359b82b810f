"""Start to first step of train.py with a cold and a warm persistent compilation cache (issue 40; goal: warm <= 20%
of cold). Each run is a fresh process and a fresh work directory; the cold run starts with an empty cache folder and
the warm run, next, reads what the cold one wrote. The corpus is prepared once beforehand, outside the timings.

  python bench/cache_start.py [--config configs/base.py] [--runs 1] [--config.batch_size=128 ...]

Time to first step: from starting the process to train.py's line "step N: compiled and ran in X s", which follows
the first step's sync; the process is then stopped. It is the time before the first step (imports, data, the
initialisation's compile) plus the first step (tracing, the step's compile, its run), both printed. `--config.key=value`
arguments go to train.py (on a CPU a smaller batch_size keeps the first step's own run, which no cache shortens, from
hiding the compile). Prints a table and writes bench/results/cache_start-<date>-<device>-<config>.json (or --out):
date, device, JAX version, commands, every run, the medians.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIRST_STEP = re.compile(r"step (\d+): compiled and ran in ([\d.]+) s(?: \(compilation cache: (\d+) programs loaded, "
                        r"(\d+) written\))?")
# train.py for one step: no evaluation, no checkpoint before the end.
ONE_STEP = ["--config.num_train_steps=1", "--config.eval_every=0", "--config.eval_bleu_every=0",
            "--config.checkpoint_every=1000000"]


def first_step(command: list[str], timeout: float) -> dict:
  """Runs `command` until its first-step line; {'seconds': from start to that line, 'step_line_seconds': the
  first step's own time as train.py logs it, 'loaded', 'written': programs of the cache, 'timeline': [seconds from
  the start, line] for every line before it, JAX's compile log included: where a warm start spends its time}.
  Stops the process then."""
  start = time.perf_counter()
  proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                          env=dict(os.environ, PYTHONUNBUFFERED="1", JAX_LOG_COMPILES="1"))
  tail: list[str] = []
  timeline: list[tuple[float, str]] = []
  try:
    for line in proc.stdout:
      tail = (tail + [line])[-40:]
      timeline.append((round(time.perf_counter() - start, 2), line.strip()[-160:]))
      match = FIRST_STEP.search(line)
      if match:
        seconds = time.perf_counter() - start
        return {"seconds": round(seconds, 2), "step_line_seconds": float(match[2]),
                "loaded": int(match[3] or 0), "written": int(match[4] or 0), "timeline": timeline}
      if time.perf_counter() - start > timeout:
        break
    raise RuntimeError(f"no first-step line from {' '.join(command)} (exit {proc.poll()}):\n{''.join(tail)}")
  finally:
    if proc.poll() is None:
      proc.kill()  # after its first step: the rest (checkpoint, plots) is not measured
    proc.wait()
    proc.stdout.close()


def main(argv: list[str]):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/base.py")
  parser.add_argument("--runs", type=int, default=1, help="cold + warm pairs (medians reported)")
  parser.add_argument("--timeout", type=float, default=1800, help="seconds one process may take to its first step")
  parser.add_argument("--out", default=None, help="the JSON written (default: "
                      "bench/results/cache_start-<date>-<device>-<config>.json)")
  parser.add_argument("--scratch", default=None, help="folder for work directories, caches and the prepared corpus "
                      "(default: a temporary folder, removed at the end)")
  args, overrides = parser.parse_known_args(argv)
  if any(not o.startswith("--config.") for o in overrides):
    parser.error(f"unknown arguments: {[o for o in overrides if not o.startswith('--config.')]}")
  import jax

  scratch_context = tempfile.TemporaryDirectory(prefix="cache_start_") if args.scratch is None else None
  scratch = pathlib.Path(args.scratch or scratch_context.name)
  prepared = [f"--config.data.prepared_dir={scratch / 'prepared'}"]
  python = sys.executable
  prepare = [python, "-m", "gshard_mt.tools.prepare_data", "--config", args.config, "--workdir",
             str(scratch / "prepare"), *prepared, *overrides, "--compilation_cache", "off"]
  print("preparing the corpus (not timed):", " ".join(prepare), flush=True)
  subprocess.run(prepare, cwd=ROOT, check=True)

  runs, load = [], [round(os.getloadavg()[0], 2)]  # other processes' load, at the start and after each run
  for i in range(args.runs):
    cache = scratch / f"cache{i}"
    row = {}
    for kind in ("cold", "warm"):
      command = [python, "train.py", "--config", args.config, "--workdir", str(scratch / f"run{i}-{kind}"),
                 *ONE_STEP, *prepared, *overrides, "--compilation_cache", str(cache)]
      row[kind] = first_step(command, args.timeout)
      print(f"run {i + 1} {kind}: {row[kind]}", flush=True)
    row["cache_bytes"] = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
    load.append(round(os.getloadavg()[0], 2))
    runs.append(row)

  cold = statistics.median(r["cold"]["seconds"] for r in runs)
  warm = statistics.median(r["warm"]["seconds"] for r in runs)
  device = jax.devices()[0]
  result = {
      "date": datetime.date.today().isoformat(), "device": device.device_kind, "platform": device.platform,
      "cpu_count": os.cpu_count(), "jax": jax.__version__, "config": args.config, "overrides": overrides,
      "command": "python bench/cache_start.py " + " ".join(argv),
      "train_command": f"python train.py --config {args.config} --workdir <fresh> " + " ".join(ONE_STEP + overrides)
      + " --compilation_cache <cache>",
      "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                               text=True).stdout.strip() or None,
      "load_average_1min": load, "runs": runs, "cold_median_s": cold, "warm_median_s": warm,
      "warm_over_cold": round(warm / cold, 3),
  }
  kind = re.sub(r"[^a-z0-9]+", "-", device.device_kind.lower()).strip("-")
  out = pathlib.Path(args.out or ROOT / "bench" / "results" /
                     f"cache_start-{result['date']}-{kind}-{pathlib.Path(args.config).stem}.json")
  out.write_text(json.dumps(result, indent=1) + "\n")
  print(f"\n{args.config} {' '.join(overrides)}; {device.device_kind}, {os.cpu_count()} cores, JAX {jax.__version__}")
  print("| cache | start to first step, s | before the first step, s | first step, s | programs loaded |\n"
        "|---|---|---|---|---|")
  for kind, median in (("cold", cold), ("warm", warm)):
    step = statistics.median(r[kind]["step_line_seconds"] for r in runs)
    before = statistics.median(r[kind]["seconds"] - r[kind]["step_line_seconds"] for r in runs)
    print(f"| {kind} | {median:.1f} | {before:.1f} | {step:.1f} | "
          f"{statistics.median(r[kind]['loaded'] for r in runs):.0f} |")
  print(f"warm / cold: {warm / cold:.2f} (goal <= 0.2)\nwrote {out}")
  if scratch_context is not None:
    scratch_context.cleanup()


if __name__ == "__main__":
  sys.path.insert(0, str(ROOT))
  from gshard_mt import cli

  cli.run(main, cache=False)  # (this process compiles nothing; train.py's do)

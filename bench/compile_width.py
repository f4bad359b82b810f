"""Compile time of the first training step against model width (issue 40, item 3: at width 1024 at most 1.5x that at
512), for the layer layouts to choose from, and the step time of each layout at a small batch.

  python bench/compile_width.py [--config configs/base.py] [--widths 512,1024] [--repeats 3]
      [--layout NAME=key=value,key=value ...] [--step_batch 16] [--step_group_size 128] [--steps 5]
      [--out bench/results/compile_width-<date>-<device>.json]

Width W sets model.emb_dim=W, model.num_heads=W/head_dim, model.mlp_dim=moe.hidden_dim=4W (configs/base.py is
W=512: 8 heads of 64, FFN and experts 2048). Each --layout is a name and the overrides that make it from the config
(default: `configured`, nothing changed, and `scanned`, model.scan_layers=True). Every compile runs in a fresh
process without the persistent compilation cache, for one CPU device from abstract values (the dry run's
`step_cost.compile_step`: nothing allocated, the configured batch); the JSON keeps every run, the medians and, per
layout, the largest width's compile over the smallest's. --step_batch > 0 also times the step of each layout at the
smallest width on real arrays (random tokens) with that many rows and MoE groups of --step_group_size tokens: the
median of --steps steps after one warm-up, a relative measure only. The load average is recorded before and after
each run (other processes share the cores).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_LAYOUTS = ("configured=", "scanned=model.scan_layers=True")


def width_overrides(width: int, head_dim: int) -> dict[str, str]:
  """The overrides of a model of width `width` (heads of `head_dim`, FFN and experts 4 x width)."""
  if width % head_dim:
    raise ValueError(f"width {width} is not a multiple of model.head_dim={head_dim}")
  return {"model.emb_dim": str(width), "model.num_heads": str(width // head_dim), "model.mlp_dim": str(4 * width),
          "moe.hidden_dim": str(4 * width)}


def parse_layout(text: str) -> tuple[str, dict[str, str]]:
  """'scan2=model.scan_layers=True,model.scan_unroll=2' -> ('scan2', {'model.scan_layers': 'True', ...})."""
  name, _, rest = text.partition("=")
  overrides = {}
  for part in filter(None, rest.split(",")):
    key, sep, value = part.partition("=")
    if not sep:
      raise ValueError(f"--layout {text!r}: expected NAME=key=value,key=value")
    overrides[key] = value
  return name, overrides


def one(spec: dict) -> dict:
  """In a fresh process: lower and compile the step (and time it when spec['step_batch'] > 0). As
  `step_cost.compile_step`, with the compile's CPU time of this process beside its wall time (less moved by other
  processes on the cores)."""
  import flax.linen as nn
  import jax

  from gshard_mt import compilation_cache
  from gshard_mt import config as config_lib
  from gshard_mt.batch import BATCH_KEYS, FIELDS
  from gshard_mt.model.transformer import Transformer
  from gshard_mt.parallel import shardings
  from gshard_mt.tools import dryrun
  from gshard_mt.tpu.estimates import hlo as hlo_lib
  from gshard_mt.training.setup import build

  compilation_cache.setup("off")  # compile times, which a cached program would hide
  config = dryrun.load_for(spec["config"], spec["overrides"] | {"mesh.data": "1"}, 1)
  devices = jax.devices()[:1]
  setup = build(config, config.data.vocab_size, devices=devices)
  state = setup.abstract_target()
  sharding = shardings.batch_sharding(setup.mesh, setup.rules)
  lengths = dict(zip(FIELDS, config_lib.row_lengths(config)))
  batch = {k: jax.ShapeDtypeStruct((config.batch_size, lengths[k.split("_")[0]]), jax.numpy.int32, sharding=sharding)
           for k in BATCH_KEYS}
  step = setup.jit_train_step(Transformer(setup.model_cfg, deterministic=False), config)
  with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
    start = time.perf_counter()
    lowered = step.lower(state, batch)
    lower_s = time.perf_counter() - start
    start, cpu = time.perf_counter(), time.process_time()
    program = lowered.compile()
    compile_s, compile_cpu_s = time.perf_counter() - start, time.process_time() - cpu
  out = {"lower_seconds": round(lower_s, 2), "compile_seconds": round(compile_s, 2),
         "compile_cpu_seconds": round(compile_cpu_s, 2), "hlo_instructions": hlo_lib.instruction_count(
             program.as_text()), "group_size": config.moe.group_size}
  if spec.get("step_batch"):
    out |= step_time(config_lib.replace(config, {"batch_size": spec["step_batch"],
                                                 "moe.group_size": spec["step_group_size"]}), devices, spec["steps"])
  return out


def step_time(config, devices, steps: int) -> dict:
  """The median seconds of `steps` training steps after one warm-up, on random tokens (every row one sentence)."""
  import flax.linen as nn
  import jax
  import numpy as np

  from gshard_mt import config as config_lib
  from gshard_mt.batch import FIELDS
  from gshard_mt.model.transformer import Transformer
  from gshard_mt.parallel import shardings
  from gshard_mt.training.setup import build

  setup = build(config, config.data.vocab_size, devices=devices)
  state = setup.init_state(config.seed)
  step = setup.jit_train_step(Transformer(setup.model_cfg, deterministic=False), config)
  rng = np.random.default_rng(0)
  batch = {}
  for field, length in zip(FIELDS, config_lib.row_lengths(config)):
    shape = (config.batch_size, length)
    batch[field] = rng.integers(4, config.data.vocab_size, shape, dtype=np.int32)
    batch[f"{field}_segmentation"] = np.ones(shape, np.int32)
    batch[f"{field}_position"] = np.broadcast_to(np.arange(length, dtype=np.int32), shape).copy()
  times = []
  with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
    batch = jax.device_put(batch, shardings.batch_sharding(setup.mesh, setup.rules))
    for _ in range(steps + 1):
      start = time.perf_counter()
      state, metrics = step(state, batch)
      jax.block_until_ready((state, metrics))
      times.append(time.perf_counter() - start)
  return {"first_step_seconds": round(times[0], 2), "step_seconds": [round(t, 3) for t in times[1:]],
          "step_median_seconds": round(statistics.median(times[1:]), 3), "step_loss": float(metrics["loss"])}


def run_one(spec: dict) -> dict:
  load = os.getloadavg()[0]
  cmd = [sys.executable, __file__, "--one", json.dumps(spec)]
  done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
  if done.returncode:
    sys.stderr.write(done.stderr)
    raise RuntimeError(f"a compile exited with {done.returncode}: {spec}")
  return json.loads(done.stdout.strip().splitlines()[-1]) | {"load_before": round(load, 2),
                                                            "load_after": round(os.getloadavg()[0], 2)}


def environment() -> dict:
  import jax

  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
  dirty = subprocess.run(["git", "status", "--porcelain", "--", "gshard_mt"], capture_output=True, text=True,
                         cwd=ROOT).stdout
  return {"date": datetime.date.today().isoformat(), "device": f"{jax.devices()[0].device_kind} "
          f"({os.cpu_count()} cores, shared)", "platform": jax.devices()[0].platform, "jax": jax.__version__,
          "commit": commit.strip() + (" (gshard_mt/ modified)" if dirty.strip() else ""), "cpu_count": os.cpu_count()}


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/base.py")
  parser.add_argument("--widths", default="512,1024")
  parser.add_argument("--layout", action="append", help="NAME=key=value,... (repeatable)")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--step_batch", type=int, default=16, help="0: no step times")
  parser.add_argument("--step_group_size", type=int, default=128)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--out", default=None)
  parser.add_argument("--one", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.one:
    print(json.dumps(one(json.loads(args.one))), flush=True)
    return
  from gshard_mt import cli

  head_dim = cli.load(args.config, {}).model.head_dim
  widths = [int(w) for w in args.widths.split(",")]
  layouts = dict(parse_layout(text) for text in (args.layout or DEFAULT_LAYOUTS))
  env = environment()
  command = shlex.join(["python", "bench/compile_width.py", *argv])
  specs = {(name, w): {"config": args.config, "overrides": overrides | width_overrides(w, head_dim)}
           for name, overrides in layouts.items() for w in widths}
  runs = {key: [] for key in specs}
  for r in range(args.repeats):  # each repeat goes over every point, so that a busy minute does not hit one point
    for (name, width), spec in specs.items():
      timed = args.step_batch if width == widths[0] and r == 0 else 0
      runs[name, width].append(run_one(spec | {"step_batch": timed, "step_group_size": args.step_group_size,
                                               "steps": args.steps}))
      print(json.dumps({"layout": name, "width": width} | runs[name, width][-1]), flush=True)
  points = []
  for (name, width), spec in specs.items():
    done = runs[name, width]
    points.append({"layout": name, "width": width, "overrides": spec["overrides"], "runs": done,
                   **{f"{k}_median_s": statistics.median(r[f"{k}_seconds"] for r in done)
                      for k in ("lower", "compile", "compile_cpu")},
                   **{k: v for k, v in done[0].items() if k.startswith("step_") or k == "first_step_seconds"}})
  summary = {}
  for name in layouts:
    by_width = {p["width"]: p for p in points if p["layout"] == name}
    first, last = by_width[widths[0]], by_width[widths[-1]]
    summary[name] = {"compile_s": {str(w): p["compile_median_s"] for w, p in by_width.items()},
                     "lower_plus_compile_s": {str(w): round(p["compile_median_s"] + p["lower_median_s"], 2)
                                              for w, p in by_width.items()},
                     "compile_cpu_s": {str(w): p["compile_cpu_median_s"] for w, p in by_width.items()},
                     "compile_ratio": round(last["compile_median_s"] / first["compile_median_s"], 2),
                     "compile_cpu_ratio": round(last["compile_cpu_median_s"] / first["compile_cpu_median_s"], 2),
                     "step_median_s": first.get("step_median_seconds")}
  result = {"environment": env, "command": command, "config": args.config, "widths": widths,
            "step_batch": args.step_batch, "step_group_size": args.step_group_size, "repeats": args.repeats,
            "compile_width": {"summary": summary, "points": points}}
  out = pathlib.Path(args.out or ROOT / "bench" / "results" / f"compile_width-{env['date']}-{env['platform']}.json")
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(result, indent=1) + "\n")
  print("\n| layout | " + " | ".join(f"compile s (CPU s), width {w}" for w in widths) + " | ratio (CPU) | step s "
        f"(width {widths[0]}, batch {args.step_batch}) |\n|---|" + "---|" * (len(widths) + 2))
  for name, s in summary.items():
    print(f"| {name} | " + " | ".join(f"{s['compile_s'][str(w)]} ({s['compile_cpu_s'][str(w)]})" for w in widths)
          + f" | {s['compile_ratio']} ({s['compile_cpu_ratio']}) | {s['step_median_s']} |")
  print(f"wrote {out}")


if __name__ == "__main__":
  main(sys.argv[1:])

"""The paper's six MoE models (GShard Table 3), each compiled by the real TPU compiler for the TPU v3 topology of
its core count, beside the paper's figures: steps/s (Table 3) and, for MoE(2048E, 36L), about 6 GB of weights
and 6 GB of activations per core (Figure 7).

  python bench/paper_dryruns.py [--models 2048e_36l,128e_12l] [--out runs/dryrun/paper] [--no_step_time]

Runs the dry run of gshard_mt.tools.dryrun (`--topology`) for each model, writing <out>/<model>/dryrun.{json,md}
(an existing dryrun.json is reused: delete it to recompile), then prints a markdown table. Steps/s, tokens/s and
MFU are the TPU compiler's estimates, lower bounds on time, not measurements. The step time needs compiles of 1
and 2 unrolled layer units per stack, which the 12L and 36L models of an expert count share (same batch, only
the depth differs), so they run in one process. Each compile takes minutes on a small CPU machine.
"""

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOPOLOGY = {128: "v3:8x8", 512: "v3:16x16", 2048: "v3:32x32"}  # v3 chips have 2 cores, one device each
PAPER_STEPS_PER_SECOND = {"128e_36l": 0.67, "512e_36l": 1.05, "2048e_36l": 0.72,  # GShard Table 3
                          "128e_12l": 2.16, "512e_12l": 3.28, "2048e_12l": 2.15}
PAPER_MEMORY = {"2048e_36l": "~6 GB + ~6 GB"}  # Figure 7, read off the chart: weights + activations per core
GIB = 2**30


def dry_run(model: str, out: pathlib.Path, step_time: bool, points: dict) -> dict:
  """The report of configs/moe_<model>.py on its v3 topology; `points` as in tpu.estimates.step_cost.step_time,
  shared by the models of one expert count and batch."""
  from gshard_mt import config_files
  from gshard_mt.tools import dryrun

  path = out / model / "dryrun.json"
  config_path = ROOT / "configs" / f"moe_{model}.py"
  config = config_files.load_file(config_path)
  shared = points.setdefault((config.moe.num_experts, config.batch_size), {})
  if path.exists():
    report = json.loads(path.read_text())
    for point, cost in report["estimate"].get("depth_points", {}).items():
      shared[tuple(int(n) for n in point.split("+"))] = cost
    return report
  report = dryrun.plan(str(config_path), {}, TOPOLOGY[config.moe.num_experts], with_time=step_time, points=shared)
  dryrun.write(report, f"configs/moe_{model}.py", path.parent)
  return report


def row(model: str, r: dict) -> str:
  m, est = r["per_device_bytes"], r["estimate"]
  steps = f"{est['steps_per_second']:.2f}" if "steps_per_second" in est else "-"
  mfu = f"{est['mfu_bound']:.0%}" if "mfu_bound" in est else "-"
  tokens = est["tokens_per_step"] // 2
  return (f"| MoE({model.replace('e_', 'E, ').upper()}) | {r['topology']} ({r['devices']}) | {tokens / 2**20:g}M "
          f"| {r['parameters'] / 1e9:.1f}B | {m['peak'] / GIB:.2f} | {'yes' if r['fits'] else 'no'} | {steps} "
          f"| {PAPER_STEPS_PER_SECOND[model]} | {mfu} | {(m['parameters'] + m['optimizer_state']) / GIB:.2f} + "
          f"{m['temp'] / GIB:.2f} | {PAPER_MEMORY.get(model, '')} | {est['flops_per_device'] / 1e12:.1f} |")


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--models", default=",".join(PAPER_STEPS_PER_SECOND))
  parser.add_argument("--out", default="runs/dryrun/paper")
  parser.add_argument("--no_step_time", action="store_true", help="skip the compiles behind the step time")
  args = parser.parse_args()
  out, points, reports = ROOT / args.out, {}, {}
  for model in args.models.split(","):
    reports[model] = dry_run(model, out, not args.no_step_time, points)
    print(f"{model}: compiled in {reports[model]['compile_seconds']} s", file=sys.stderr, flush=True)
  print("| model | topology (cores) | batch (tokens per side) | parameters | peak GiB/core | fits 16 GiB | "
        "steps/s (compiler's estimate) | steps/s (paper) | MFU bound | weights + optimizer, temporaries GiB/core "
        "| paper (Figure 7) | TFLOP/device/step |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  for model, r in reports.items():
    print(row(model, r))


if __name__ == "__main__":
  main()

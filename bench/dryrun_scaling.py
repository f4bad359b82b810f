"""Compile time against device count (GShard's Figure 2b claim: one SPMD program, so compile time does not grow
with the number of devices). Compiles the same configuration for each device count in a fresh process.

  python bench/dryrun_scaling.py [--config configs/moe_2048e_36l.py] [--devices 8,64,512,2048] [--layers 4]
                                 [--cpu_all_to_all]

--layers reduces the depth (encoder = decoder = layers) to stay quick; experts are set to the largest device
count and the mesh to one expert axis over all devices. Prints one JSON line per device count and a table with
the ratio to the smallest count. --cpu_all_to_all keeps XLA's CPU all-to-all decomposer (gshard_mt.tools.dryrun
switches it off), to show what it costs.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/moe_2048e_36l.py")
  parser.add_argument("--devices", default="8,64,512,2048")
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--cpu_all_to_all", action="store_true")
  args = parser.parse_args()
  counts = [int(d) for d in args.devices.split(",")]
  rows = []
  for n in counts:
    with tempfile.TemporaryDirectory() as out:
      cmd = [sys.executable, "-m", "gshard_mt.tools.dryrun", "--config", args.config, "--devices", str(n),
             "--mesh", f"data=1,expert={n}", "--out", out, f"--config.moe.num_experts={max(counts)}",
             f"--config.model.num_encoder_layers={args.layers}", f"--config.model.num_decoder_layers={args.layers}",
             f"--config.batch_size={max(counts) * 4}"] + (["--cpu_all_to_all"] if args.cpu_all_to_all else [])
      env = dict(os.environ, PYTHONPATH=str(ROOT))
      env.pop("JAX_NUM_CPU_DEVICES", None)
      subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
      report = json.loads((pathlib.Path(out) / "dryrun.json").read_text())
    row = {"devices": n, "lower_seconds": report["lower_seconds"], "compile_seconds": report["compile_seconds"],
           "all_to_all_per_step": report["collectives"]["all-to-all"]["count"],
           "peak_gib_per_device": round(report["per_device_bytes"]["peak"] / 2**30, 2)}
    rows.append(row)
    print(json.dumps(row), flush=True)
  base = rows[0]["compile_seconds"]
  print(f"\n{args.config}, {args.layers}+{args.layers} layers, {max(counts)} experts, one CPU process per count, "
        f"CPU all-to-all decomposer {'on' if args.cpu_all_to_all else 'off'}")
  print("| devices | lowering s | compile s | compile / first | all-to-all per step | peak GiB per device |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['devices']} | {r['lower_seconds']} | {r['compile_seconds']} | {r['compile_seconds'] / base:.2f} | "
          f"{r['all_to_all_per_step']} | {r['peak_gib_per_device']} |")


if __name__ == "__main__":
  main()

"""Compile time of the training step against depth: layers are scanned in (dense, MoE) units, so a 36-layer model
should compile about as fast as a 12-layer one (the goal: at most 1.5x).

  python bench/compile_depth.py [--config configs/base.py] [--layers 6,18]

--layers gives encoder = decoder layers per point (6 -> 12 layers in all, 18 -> 36). Compiles for one device
from abstract values (nothing allocated); prints one JSON line per depth and a table.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gshard_mt import cli  # noqa: E402


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/base.py")
  parser.add_argument("--layers", default="6,18")
  args = parser.parse_args(argv)
  import jax

  from gshard_mt.tools import dryrun

  rows = []
  for n in (int(x) for x in args.layers.split(",")):
    config = dryrun.load_for(args.config, {"model.num_encoder_layers": str(n), "model.num_decoder_layers": str(n),
                                           "mesh.data": "1"}, 1)
    report = dryrun.dry_run(config, jax.devices()[:1])
    rows.append({"layers": 2 * n, "lower_seconds": report["lower_seconds"],
                 "compile_seconds": report["compile_seconds"], "device": jax.devices()[0].device_kind})
    print(json.dumps(rows[-1]), flush=True)
  base = rows[0]["lower_seconds"] + rows[0]["compile_seconds"]
  print(f"\n{args.config}, JAX {jax.__version__}, {rows[0]['device']}")
  print("| layers | lowering s | compile s | (lowering + compile) / first |\n|---|---|---|---|")
  for r in rows:
    print(f"| {r['layers']} | {r['lower_seconds']} | {r['compile_seconds']} | "
          f"{(r['lower_seconds'] + r['compile_seconds']) / base:.2f} |")


if __name__ == "__main__":
  cli.run(main, cache=False)  # compile times, which a cached program would hide

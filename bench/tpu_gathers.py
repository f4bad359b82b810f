"""What the TPU compiler's estimate charges a row gather, as a TensorCore fusion or offloaded to the SparseCores (an
estimate, not a measurement).

  python bench/tpu_gathers.py [--topology v5p:1x1x1]

Gathers 20,480 rows of 512 bf16 values (the MoE dispatch of configs/base.py's encoder on one v5p chip: E·G·C slots
from G·S tokens) from tables of 4,096 to 32,768 rows, once with libtpu's defaults and once with the option
`gshard_mt.xla_flags.SPARSECORE_GATHERS`. libtpu reads its flags once per process, so each setting runs in a
process of its own. Prints, per table size and setting, how the gather was compiled and its `optimal_seconds`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROWS, M, TABLES = 20480, 512, (4096, 8192, 12288, 16384, 32768)


def estimates(topology: str) -> list[tuple[str, float]]:
  """[(how each table's gather was compiled, its estimated seconds)] in this process's libtpu settings."""
  import jax
  import jax.numpy as jnp

  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  _, sharding = tpu.one_chip(topology)
  index = jax.ShapeDtypeStruct((ROWS,), jnp.int32, sharding=sharding)
  out = []
  for rows in TABLES:
    table = jax.ShapeDtypeStruct((rows, M), jnp.bfloat16, sharding=sharding)
    compiled = jax.jit(lambda x, i: x[i]).lower(table, index).compile()
    how = "SparseCores" if "gather_offload" in compiled.as_text() else "TensorCore fusion"
    out.append((how, tpu.compiler_cost(compiled)["optimal_seconds"]))
  return out


def main(argv):
  from gshard_mt import cli, xla_flags

  parser = cli.parser(__doc__)
  parser.add_argument("--topology", default="v5p:1x1x1")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    print(json.dumps(estimates(args.topology)))
    return
  runs = {}
  for label, init_args in (("libtpu's defaults", ""), (xla_flags.SPARSECORE_GATHERS, xla_flags.SPARSECORE_GATHERS)):
    env = {**os.environ, "LIBTPU_INIT_ARGS": init_args, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, __file__, "--topology", args.topology, "--child"], env=env,
                          capture_output=True, text=True, check=True)
    runs[label] = json.loads(proc.stdout.splitlines()[-1])
  print(f"{ROWS:,} rows of {M} bf16 gathered on {args.topology}, TPU compiler's estimate (us)\n")
  print("| table rows (MiB) | " + " | ".join(runs) + " |\n|---|" + "---|" * len(runs))
  for i, rows in enumerate(TABLES):
    cells = [f"{run[i][1] * 1e6:.1f} ({run[i][0]})" for run in runs.values()]
    print(f"| {rows:,} ({rows * M * 2 / 2**20:.0f}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
  from gshard_mt import cli

  cli.run(main)

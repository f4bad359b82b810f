"""Where the TPU compiler's estimate of a training step goes, by part of the model (an estimate, a lower bound on
time, not a measurement).

  python bench/step_breakdown.py --config configs/base.py --topology v5p:2x2x1 [--top 20] \
      --config.model.num_encoder_layers=2 --config.model.num_decoder_layers=2

Compiles the step with the layers unrolled (model.scan_layers=False, so every layer is counted), splits the
compiler's roofline per scheduled instruction (`gshard_mt.compiler.roofline.instruction_costs`) and sums it by part
(`gshard_mt.compiler.parts`, the parts that bench/profile_step.py measures on an accelerator): the optimizer, the
logits and loss, attention, the MoE expert matmuls, ... Prints the compiler's own total (`optimal_seconds`) beside
the per-instruction sum: the two differ, and the difference is printed too. --top N then lists the N costliest
instructions (of the parts named with --part) with their part, result shape and JAX operation.
"""

from __future__ import annotations

import collections

from gshard_mt import cli
from gshard_mt import config as config_lib
from gshard_mt.compiler.parts import part_of


def main(argv):
  args, overrides = config_lib.split_overrides(argv)
  parser = cli.parser(__doc__, config=True)
  parser.add_argument("--topology", default="v5p:2x2x1")
  parser.add_argument("--top", type=int, default=0, help="also list the N costliest instructions")
  parser.add_argument("--part", default="", help="list only the instructions of parts whose name contains this")
  parsed = parser.parse_args(args)
  from gshard_mt.compiler import roofline, tpu
  from gshard_mt.tools import dryrun, step_cost

  devices = tpu.topology_devices(parsed.topology)
  config = dryrun.load_for(parsed.config, {**overrides, "model.scan_layers": "False"}, len(devices))
  program = step_cost.compile_step(config, devices)[2]
  parts = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
  rows = roofline.instruction_costs(program.as_text(), *roofline.compiler_roofline(devices[0]))
  for row in rows:
    row["part"] = part_of(row["source"], row["op_name"], row["opcode"])
    total = parts[row["part"]]
    total[0] += row["seconds"]
    total[1] += row["flops"]
    total[2] += row["bytes"]
  summed = sum(p[0] for p in parts.values())
  optimal = tpu.compiler_cost(program)["optimal_seconds"]
  print(f"compiler's optimal_seconds {optimal * 1e3:.2f} ms; per-instruction sum {summed * 1e3:.2f} ms "
        f"({(optimal - summed) * 1e3:.2f} ms unattributed)\n")
  print("| part | est. ms | share of sum | GFLOP | GiB |\n|---|---|---|---|---|")
  for name, (seconds, flops, nbytes) in sorted(parts.items(), key=lambda kv: -kv[1][0]):
    print(f"| {name} | {seconds * 1e3:.2f} | {seconds / summed:.0%} | {flops / 1e9:.0f} | {nbytes / 2**30:.2f} |")
  if parsed.top:
    print("\n| est. ms | GiB | GFLOP | part | opcode | result | JAX operation |\n|---|---|---|---|---|---|---|")
    listed = [r for r in rows if parsed.part in r["part"]]
    for row in sorted(listed, key=lambda r: -r["seconds"])[:parsed.top]:
      print(f"| {row['seconds'] * 1e3:.3f} | {row['bytes'] / 2**30:.3f} | {row['flops'] / 1e9:.1f} | {row['part']} "
            f"| {row['opcode']} | {row['result'][:60]} | {row['op_name'][-90:]} |")

if __name__ == "__main__":
  cli.run(main, prog="python bench/step_breakdown.py")

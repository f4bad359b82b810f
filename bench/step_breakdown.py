"""Where the TPU compiler's estimate of a training step goes, by part of the model (an estimate, a lower bound on
time, not a measurement).

  python bench/step_breakdown.py --config configs/base.py --topology v5p:2x2x1 [--top 20] \
      --config.model.num_encoder_layers=2 --config.model.num_decoder_layers=2

Compiles the step with the layers unrolled (model.scan_layers=False, so every layer is counted), splits the
compiler's roofline per scheduled instruction (`gshard_mt.tpu.estimates.roofline.instruction_costs`) and sums it by part
(`gshard_mt.tpu.estimates.parts`, the parts that bench/profile_step.py measures on an accelerator): the optimizer, the
logits and loss, attention, the MoE expert matmuls, ... Prints the compiler's own total (`optimal_seconds`) beside
the per-instruction sum: the two differ, and the difference is printed too, and so are the bytes each counts.
--top N then lists the N costliest instructions (of the parts named with --part) with their part, result shape and
JAX operation.

--per-fusion adds a column: the compiler's own estimate of each fusion compiled alone
(`gshard_mt.tpu.estimates.fusion_cost`), the per-instruction roofline for the rest; its sum is printed beside the other
two. It says which parts the compiler charges beyond their FLOPs and bytes (an estimate of an estimate: a fusion
alone chooses its own layouts).
"""

from __future__ import annotations

import collections

from gshard_mt import cli
from gshard_mt import config as config_lib
from gshard_mt.tpu.estimates.parts import part_of


def main(argv):
  args, overrides = config_lib.split_overrides(argv)
  parser = cli.parser(__doc__, config=True)
  parser.add_argument("--topology", default="v5p:2x2x1")
  parser.add_argument("--top", type=int, default=0, help="also list the N costliest instructions")
  parser.add_argument("--part", default="", help="list only the instructions of parts whose name contains this")
  parser.add_argument("--per-fusion", action="store_true", help="also each fusion's estimate, compiled alone")
  parsed = parser.parse_args(args)
  from gshard_mt.tools import dryrun
  from gshard_mt.tpu.estimates import fusion_cost, roofline, step_cost
  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  devices = tpu.topology_devices(parsed.topology)
  config = dryrun.load_for(parsed.config, {**overrides, "model.scan_layers": "False"}, len(devices))
  program = step_cost.compile_step(config, devices)[2]
  parts = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
  rows = roofline.instruction_costs(program.as_text(), *roofline.compiler_roofline(devices[0]))
  alone = fusion_cost.fusion_seconds(program.as_text(), devices[0]) if parsed.per_fusion else {}
  for row in rows:
    row["part"] = part_of(row["source"], row["op_name"], row["opcode"])
    total = parts[row["part"]]
    total[0] += row["seconds"]
    total[1] += row["flops"]
    total[2] += row["bytes"]
    total[3] += row["seconds"] if alone.get(row["name"]) is None else alone[row["name"]]
  summed = sum(p[0] for p in parts.values())
  cost = tpu.compiler_cost(program)
  optimal = cost["optimal_seconds"]
  print(f"compiler's optimal_seconds {optimal * 1e3:.2f} ms; per-instruction sum {summed * 1e3:.2f} ms "
        f"({(optimal - summed) * 1e3:.2f} ms unattributed)")
  print(f"compiler's bytes accessed {cost['bytes accessed'] / 2**30:.2f} GiB; per-instruction operands and results "
        f"{sum(p[2] for p in parts.values()) / 2**30:.2f} GiB")
  if alone:
    print(f"fusions compiled alone ({sum(v is not None for v in alone.values())} of {len(alone)}), the rest by "
          f"roofline: {sum(p[3] for p in parts.values()) * 1e3:.2f} ms")
  extra = ("", "") if not alone else (" fusions alone, ms |", "---|")
  print(f"\n| part | est. ms | share of sum | GFLOP | GiB |{extra[0]}\n|---|---|---|---|---|{extra[1]}")
  for name, (seconds, flops, nbytes, apart) in sorted(parts.items(), key=lambda kv: -kv[1][0]):
    print(f"| {name} | {seconds * 1e3:.2f} | {seconds / summed:.0%} | {flops / 1e9:.0f} | {nbytes / 2**30:.2f} |"
          + (f" {apart * 1e3:.2f} |" if alone else ""))
  if parsed.top:
    print("\n| est. ms | GiB | GFLOP | part | opcode | result | JAX operation |\n|---|---|---|---|---|---|---|")
    listed = [r for r in rows if parsed.part in r["part"]]
    for row in sorted(listed, key=lambda r: -r["seconds"])[:parsed.top]:
      print(f"| {row['seconds'] * 1e3:.3f} | {row['bytes'] / 2**30:.3f} | {row['flops'] / 1e9:.1f} | {row['part']} "
            f"| {row['opcode']} | {row['result'][:60]} | {row['op_name'][-90:]} |")


if __name__ == "__main__":
  cli.run(main)

"""Show what partitioning does to the MoE layer and to one training step.

  python -m gshard_mt.tools.inspect_sharding --config configs/tiny.py --mesh data=2,expert=4 [--config.key=value ...]

For each einsum of the MoE layer: its equation, each operand's dims mapping (which tensor dimension is split over
which mesh axis) under the config's rules, the result's, and the collective that implies. Then
the collectives XLA emitted for one compiled training step (kind, executions, bytes per device) and per-device
parameter and optimizer memory. Exits 1 when the expert axis is split but no all-to-all was emitted, or when an
expert weight is all-gathered. Uses fake CPU devices when there are too few real ones.
"""

from __future__ import annotations

import sys

import jax
from flax.linen import partitioning as nn_partitioning

from gshard_mt import cli
from gshard_mt import config as config_lib
from gshard_mt.errors import UserError
from gshard_mt.moe import axes as moe
from gshard_mt.parallel import mesh as mesh_lib
from gshard_mt.parallel import rules as rules_lib
from gshard_mt.tools import dryrun
from gshard_mt.tools.dryrun import load_for, parse_mesh

# The MoE layer's einsums with the logical names of their operands and of the result the layer asks for.
MOE_EINSUMS = [
    ("router logits", "GSM,ME->GSE", [moe.GSM, moe.ME], moe.GSE),
    ("dispatch", "GSEC,GSM->EGCM", [moe.GSEC, moe.GSM], moe.EGCM),
    ("expert FFN in", "EGCM,EMH->EGCH", [moe.EGCM, moe.EMH], moe.EGCH),
    ("expert FFN out", "EGCH,EHM->EGCM", [moe.EGCH, moe.EHM], moe.EGCM),
    ("E -> G reshard", "EGCM->EGCM", [moe.EGCM], moe.EGCM_BY_GROUP),
    ("combine", "GSEC,EGCM->GSM", [moe.GSEC, moe.EGCM_BY_GROUP], moe.GSM),
]


def mesh_axes(logical, rules) -> tuple:
  """Logical names -> mesh axes per dimension, applying flax's rule order (first free mesh axes win)."""
  return tuple(nn_partitioning.logical_to_mesh_axes(logical, rules))


def _axes(entry) -> tuple[str, ...]:
  return () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))


def einsum_collective(equation: str, operand_specs: list[tuple], result_spec: tuple) -> str:
  """The collective a sharded einsum needs (sharding propagation): contracted letters split over a mesh axis
  leave partial sums (all-reduce); a mesh axis that moves between letters from the operands to the result is an
  all-to-all; one that disappears from a kept letter is an all-gather."""
  inputs, output = equation.split("->")
  letter_axes: dict[str, set] = {}
  for letters, spec in zip(inputs.split(","), operand_specs):
    for letter, entry in zip(letters, spec):
      letter_axes.setdefault(letter, set()).update(_axes(entry))
  needed = []
  contracted = set("".join(inputs.split(","))) - set(output)
  partial = sorted({a for letter in contracted for a in letter_axes.get(letter, ())})
  if partial:
    needed.append(f"all-reduce over {partial}")
  result_axes = {letter: set(_axes(entry)) for letter, entry in zip(output, result_spec)}
  moved, gathered = set(), set()
  for letter in output:
    for axis in letter_axes.get(letter, set()) - result_axes[letter]:
      (moved if any(axis in result_axes[other] for other in output if other != letter) else gathered).add(axis)
  if moved:
    needed.append(f"all-to-all over {sorted(moved)}")
  if gathered:
    needed.append(f"all-gather over {sorted(gathered)}")
  return ", ".join(needed) or "none"


def _spec_text(letters: str, spec: tuple) -> str:
  return " ".join(f"{letter}:{'/'.join(_axes(e)) or '-'}" for letter, e in zip(letters, spec))


def report(config, devices) -> tuple[str, bool]:
  """The report text, and whether the checks passed."""
  rules = rules_lib.rules(config)
  lines = [f"rules '{config.partitioning}': " + ", ".join(f"{k}->{v}" for k, v in rules if v), "",
           "MoE layer einsums (dims mapping: tensor letter -> mesh axes):"]
  for name, equation, operands, result in MOE_EINSUMS:
    inputs, output = equation.split("->")
    specs = [mesh_axes(o, rules) for o in operands]
    result_spec = mesh_axes(result, rules)
    lines.append(f"  {name:15} {equation:18} " + " | ".join(
        f"{letters}[{_spec_text(letters, s)}]" for letters, s in zip(inputs.split(","), specs))
        + f" -> {output}[{_spec_text(output, result_spec)}]   collective: "
        + einsum_collective(equation, specs, result_spec))
  result = dryrun.dry_run(config, devices)
  data, expert, model = (result["mesh"][a] for a in mesh_lib.MESH_AXES)
  lines += ["", f"one training step on mesh data={data} expert={expert} model={model} (compiled by XLA):"]
  for kind, c in result["collectives"].items():
    lines.append(f"  {kind:19} {c['count']:5} per step, {c['bytes'] / 2**20:10.2f} MiB per device")
  m = result["per_device_bytes"]
  lines.append(f"per device: parameters {m['parameters'] / 2**20:.2f} MiB, optimizer state "
               f"{m['optimizer_state'] / 2**20:.2f} MiB, peak {m['peak'] / 2**20:.2f} MiB")
  ok = True
  if expert > 1 and result["collectives"]["all-to-all"]["count"] == 0:
    lines.append("ERROR: the expert axis is split but XLA emitted no all-to-all for the MoE dispatch")
    ok = False
  if result["expert_weight_gathers"]:
    lines.append(f"ERROR: {result['expert_weight_gathers']} all-gather(s) of whole expert weights")
    ok = False
  return "\n".join(lines), ok


def main(argv):
  args, overrides = config_lib.split_overrides(argv)

  parser = cli.parser(__doc__, config=True)
  parser.add_argument("--mesh", default="", help="e.g. data=2,expert=4")
  parsed = parser.parse_args(args)
  overrides.update({f"mesh.{k}": str(v) for k, v in parse_mesh(parsed.mesh).items()})
  mesh = cli.load(parsed.config, overrides).mesh
  devices = max(mesh.data, 1) * mesh.expert * mesh.model  # data=-1: one data slice
  config = load_for(parsed.config, overrides, devices)

  jax.config.update("jax_num_cpu_devices", devices)  # fake CPU devices where there are too few real ones
  if jax.device_count() < devices:
    raise UserError(f"need {devices} devices, JAX has {jax.device_count()}")
  text, ok = report(config, jax.devices()[:devices])
  print(text)
  sys.exit(0 if ok else 1)


if __name__ == "__main__":
  cli.run(main)

"""Plan a run before renting the pod: compile the whole training step for N fake CPU devices and report
per-device memory, the collectives of one step and the compile time. Nothing is allocated.

  python -m gshard_mt.tools.dryrun --config configs/moe_2048e_36l.py --devices 2048 [--mesh data=1,expert=2048]
                             [--hbm_gib 16] [--require_fit] [--out runs/dryrun/...] [--config.key=value ...]

Writes dryrun.json and dryrun.md into --out. Exits non-zero only with --require_fit when it does not fit.
HBM per device: 16 GiB for TPU v3, 32 for v4, 80 for an H100.

The CPU backend's all-to-all decomposer is switched off: it rewrites each all-to-all into one operand per device
(a CPU-runtime detail the accelerators do not have), which makes the program, and the compile time, grow with the
device count. The collectives and memory reported do not change (--cpu_all_to_all keeps the pass).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys
import time

from gshard_mt import cli
from gshard_mt import config as config_lib
from gshard_mt.data.packing import BATCH_KEYS
from gshard_mt.errors import ConfigError, UserError
from gshard_mt.io import write_atomically

NO_CPU_ALL_TO_ALL_DECOMPOSER = "--xla_disable_hlo_passes=all_to_all_decomposer"


def parse_mesh(text: str) -> dict[str, int]:
  """'data=2,expert=4' -> {'data': 2, 'expert': 4}."""
  out = {}
  for part in filter(None, text.split(",")):
    key, _, value = part.partition("=")
    if key not in ("data", "expert", "model") or not value.lstrip("-").isdigit():
      raise ConfigError(f"--mesh {text!r}: expected data=N,expert=N,model=N")
    out[key] = int(value)
  return out


def fit_group_size(config, num_devices: int) -> int | None:
  """When the MoE groups of a batch do not split over the mesh axes the rules give 'group', sets
  `config.moe.group_size` to the largest size below the configured one that divides the batch's tokens into a
  multiple of those devices; returns the new size (None: the configured one works, or nothing smaller does)."""
  from gshard_mt.parallel import mesh as mesh_lib
  from gshard_mt.parallel import rules as rules_lib

  tokens = config.batch_size * config.data.max_length
  sizes = dict(zip(mesh_lib.MESH_AXES, mesh_lib.mesh_shape(config, num_devices)))
  devices = rules_lib.devices_of("group", rules_lib.rules(config), sizes)

  def fits(size):
    return tokens % size == 0 and (tokens // size) % devices == 0

  if not config.model.moe_interval or fits(config.moe.group_size):
    return None
  size = next((s for s in range(min(config.moe.group_size, tokens), 0, -1) if fits(s)), None)
  if size is not None:
    config.moe.group_size = size
  return size


def load_for(config_path: str, overrides: dict, num_devices: int):
  """The config for a plan on `num_devices`, its MoE group size fitted to the mesh (said on stderr) if needed."""
  config = config_lib.load(config_path, overrides)
  before = config.moe.group_size
  if (size := fit_group_size(config, num_devices)) is not None:
    print(f"moe.group_size={before} does not split over this mesh; using moe.group_size={size}", file=sys.stderr)
  config_lib.validate(config, num_devices)
  return config


def dry_run(config, devices) -> dict:
  """Lowers and compiles one training step for `devices` from abstract values; returns the report."""
  import flax.linen as nn
  import jax

  from gshard_mt.model.transformer import Transformer
  from gshard_mt.parallel import mesh as mesh_lib
  from gshard_mt.parallel import shardings
  from gshard_mt.tools import hlo as hlo_lib
  from gshard_mt.training.setup import build

  setup = build(config, config.data.vocab_size, devices=devices)
  state = setup.abstract_target()
  batch_sharding = shardings.batch_sharding(setup.mesh, setup.rules)
  batch = {k: jax.ShapeDtypeStruct((config.batch_size, config.data.max_length), jax.numpy.int32,
                                   sharding=batch_sharding) for k in BATCH_KEYS}
  step = setup.jit_train_step(Transformer(setup.model_cfg, deterministic=False), config)
  with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
    start = time.perf_counter()
    lowered = step.lower(state, batch)
    lower_s = time.perf_counter() - start
    start = time.perf_counter()
    program = lowered.compile()
    compile_s = time.perf_counter() - start
  n_params = sum(int(x.size) for x in jax.tree.leaves(state.params))
  hlo = program.as_text()
  expert_shapes = {leaf.shape[-3:] for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]
                   if re.search(r"\['moe'\]\['w[io]'\]$", jax.tree_util.keystr(path))}
  return {
      "devices": len(devices), "mesh": dict(zip(mesh_lib.MESH_AXES, setup.mesh.devices.shape)),
      "partitioning": config.partitioning, "parameters": n_params,
      "per_device_bytes": {
          "parameters": hlo_lib.per_device_bytes(state.params, setup.state_shardings.params),
          "optimizer_state": hlo_lib.per_device_bytes(state.opt_state, setup.state_shardings.opt_state),
          **hlo_lib.memory(program)},
      "collectives": hlo_lib.collectives(hlo),
      "expert_weight_gathers": hlo_lib.gathers_of(hlo, expert_shapes),
      "hlo_instructions": hlo_lib.instruction_count(hlo),
      "lower_seconds": round(lower_s, 2), "compile_seconds": round(compile_s, 2),
  }


def markdown(report: dict, config_path: str) -> str:
  gib = lambda b: f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"  # noqa: E731
  m = report["per_device_bytes"]
  lines = [f"# Dry run: {config_path} on {report['devices']} devices", "",
           f"Mesh {report['mesh']}, rules '{report['partitioning']}', {report['parameters'] / 1e6:,.1f}M parameters.",
           "", "| per device | bytes |", "|---|---|",
           f"| parameters | {gib(m['parameters'])} |", f"| optimizer state | {gib(m['optimizer_state'])} |",
           f"| arguments (XLA) | {gib(m['argument'])} |", f"| temporaries (XLA) | {gib(m['temp'])} |",
           f"| peak = arguments + outputs - aliased + temporaries | {gib(m['peak'])} |",
           f"| fits {report['hbm_gib']} GiB HBM? | {'yes' if report['fits'] else 'no'} |", "",
           "| collective | per step | bytes per device per step | ops in the program |", "|---|---|---|---|"]
  for kind, c in report["collectives"].items():
    lines.append(f"| {kind} | {c['count']} | {gib(c['bytes'])} | {c['ops']} |")
  lines += ["", f"Compiled per-device program: {report['hlo_instructions']:,} HLO instructions. "
            f"Lowering {report['lower_seconds']} s, compilation {report['compile_seconds']} s "
            f"(one CPU host, fake devices; XLA_FLAGS {report['xla_flags']!r}).", ""]
  return "\n".join(lines)


def main(argv):
  args, overrides = config_lib.split_overrides(argv)
  parser = cli.parser(__doc__, config=True)
  parser.add_argument("--devices", type=int, required=True)
  parser.add_argument("--mesh", default="", help="e.g. data=1,expert=2048 (default: the config's mesh)")
  parser.add_argument("--hbm_gib", type=float, default=16.0)
  parser.add_argument("--require_fit", action="store_true", help="exit 1 when it does not fit the HBM")
  parser.add_argument("--out", default=None, help="default: runs/dryrun/<config>-<devices>")
  parser.add_argument("--cpu_all_to_all", action="store_true",
                      help="keep XLA's CPU all-to-all decomposer (compile time then grows with --devices)")
  parsed = parser.parse_args(args)
  for key, value in parse_mesh(parsed.mesh).items():
    overrides[f"mesh.{key}"] = str(value)
  config = load_for(parsed.config, overrides, parsed.devices)
  if not parsed.cpu_all_to_all:  # read when the CPU backend starts, below
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {NO_CPU_ALL_TO_ALL_DECOMPOSER}".strip()
  import jax

  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", parsed.devices)
  if jax.device_count() != parsed.devices:
    raise UserError(f"JAX started with {jax.device_count()} devices, not {parsed.devices}: run the dry run in a "
                    "fresh process (JAX had started before it could ask for fake devices)")
  report = dry_run(config, jax.devices())
  report["hbm_gib"] = parsed.hbm_gib
  report["xla_flags"] = os.environ.get("XLA_FLAGS", "")
  report["fits"] = report["per_device_bytes"]["peak"] <= parsed.hbm_gib * 2**30
  out = pathlib.Path(parsed.out or f"runs/dryrun/{pathlib.Path(parsed.config).stem}-{parsed.devices}")
  out.mkdir(parents=True, exist_ok=True)
  write_atomically(out / "dryrun.json", json.dumps(report, indent=2))
  write_atomically(out / "dryrun.md", markdown(report, parsed.config))
  print(markdown(report, parsed.config))
  print(f"wrote {out}/dryrun.json and dryrun.md")
  if not report["fits"]:
    need = report["per_device_bytes"]["peak"] / 2**30
    print(f"does NOT fit: {need:.2f} GiB per device needed, {parsed.hbm_gib} GiB available")
    if parsed.require_fit:
      sys.exit(1)


if __name__ == "__main__":
  cli.run(main, prog="python -m gshard_mt.tools.dryrun")

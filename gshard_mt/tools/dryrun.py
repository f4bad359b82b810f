"""Plan a run before renting the pod: compile the whole training step, without allocating anything, either with
the real TPU compiler for a TPU topology (libtpu; no TPU needed) or with XLA's CPU compiler for N fake devices.
Reports per-device memory, the collectives of one step (loop iterations counted) and the compile time; for a
TPU topology also FLOPs per device and the compiler's estimated step time, tokens/s and a bound on MFU.

  python -m gshard_mt.tools.dryrun --config configs/moe_2048e_36l.py --topology v3:32x32 [--mesh data=1,expert=2048]
  python -m gshard_mt.tools.dryrun --config configs/moe_2048e_36l.py --devices 2048 [--hbm_gib 16]
                             [--require_fit] [--no_step_time] [--out runs/dryrun/...] [--config.key=value ...]

Writes dryrun.json and dryrun.md into --out. Exits non-zero only with --require_fit when it does not fit.
HBM per device: the TPU generation's (gshard_mt/tools/tpu.py) with --topology, else --hbm_gib (default 16).

The step time is the TPU compiler's estimate (its cost model's `optimal_seconds`), a lower bound on time, not a
measurement. That estimate counts a loop body once, so it is taken from two or three more compiles of the same
model with one and two unrolled layer units per stack, and extended linearly to the configured depth (every unit
costs the same); --no_step_time skips them.

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

from gshard_mt import cli, io
from gshard_mt import config as config_lib
from gshard_mt.data.packing import BATCH_KEYS, FIELDS, row_lengths
from gshard_mt.errors import ConfigError, UserError

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
  `config.moe.group_size` to the largest size below the configured one that divides the batch's tokens of each
  side into a multiple of those devices; returns the new size (None: the configured one works, or nothing
  smaller does)."""
  from gshard_mt.parallel import mesh as mesh_lib
  from gshard_mt.parallel import rules as rules_lib

  sides = [config.batch_size * length for length in row_lengths(config)]
  sizes = dict(zip(mesh_lib.MESH_AXES, mesh_lib.mesh_shape(config, num_devices)))
  devices = rules_lib.devices_of("group", rules_lib.rules(config), sizes)

  def fits(size):
    return all(tokens % size == 0 and (tokens // size) % devices == 0 for tokens in sides)

  if not config.model.moe_interval or fits(config.moe.group_size):
    return None
  size = next((s for s in range(min(config.moe.group_size, max(sides)), 0, -1) if fits(s)), None)
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


def compile_step(config, devices):
  """(setup, abstract train state, compiled program, lowering seconds, compile seconds) of one training step for
  `devices`, from abstract values."""
  import flax.linen as nn
  import jax

  from gshard_mt.model.transformer import Transformer
  from gshard_mt.parallel import shardings
  from gshard_mt.training.setup import build

  setup = build(config, config.data.vocab_size, devices=devices)
  state = setup.abstract_target()
  batch_sharding = shardings.batch_sharding(setup.mesh, setup.rules)
  lengths = dict(zip(FIELDS, row_lengths(config)))
  batch = {k: jax.ShapeDtypeStruct((config.batch_size, lengths[k.split("_")[0]]), jax.numpy.int32,
                                   sharding=batch_sharding) for k in BATCH_KEYS}
  step = setup.jit_train_step(Transformer(setup.model_cfg, deterministic=False), config)
  with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
    start = time.perf_counter()
    lowered = step.lower(state, batch)
    lower_s = time.perf_counter() - start
    start = time.perf_counter()
    program = lowered.compile()
    compile_s = time.perf_counter() - start
  return setup, state, program, lower_s, compile_s


def dry_run(config, devices, with_time: bool = True, points: dict | None = None) -> dict:
  """Lowers and compiles one training step for `devices` from abstract values; returns the report. For TPU
  devices it has 'estimate': FLOPs and, with `with_time`, the compiler's step time (`tpu_estimates`; `points`
  as in `step_time`)."""
  import jax

  from gshard_mt.parallel import mesh as mesh_lib
  from gshard_mt.tools import hlo as hlo_lib

  setup, state, program, lower_s, compile_s = compile_step(config, devices)
  n_params = sum(int(x.size) for x in jax.tree.leaves(state.params))
  hlo = program.as_text()
  expert_shapes = {leaf.shape[-3:] for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]
                   if re.search(r"\['moe'\]\['w[io]'\]$", jax.tree_util.keystr(path))}
  report = {
      "devices": len(devices), "device_kind": devices[0].device_kind,
      "mesh": dict(zip(mesh_lib.MESH_AXES, setup.mesh.devices.shape)),
      "partitioning": config.partitioning, "parameters": n_params,
      "per_device_bytes": {
          "parameters": hlo_lib.per_device_bytes(state.params, setup.state_shardings.params),
          "optimizer_state": hlo_lib.per_device_bytes(state.opt_state, setup.state_shardings.opt_state),
          **hlo_lib.memory(program)},
      "collectives": hlo_lib.collectives(hlo),
      "moe_collectives": hlo_lib.collectives(hlo, op_name="/moe/"),
      "loop_trip_counts": sorted(hlo_lib.loops(hlo).values(), key=lambda t: (t is None, t)),
      "expert_weight_gathers": hlo_lib.gathers_of(hlo, expert_shapes),
      "hlo_instructions": hlo_lib.instruction_count(hlo),
      "lower_seconds": round(lower_s, 2), "compile_seconds": round(compile_s, 2),
  }
  if devices[0].platform == "tpu":
    report["estimate"] = tpu_estimates(config, devices, program, state.params, with_time, points)
  return report


def unit_size(config) -> int:
  from gshard_mt.model.transformer import TransformerConfig

  return TransformerConfig.from_config(config, config.data.vocab_size).unit_size


def unit_counts(config) -> tuple[int, int]:
  """Layer units (the scanned bodies) in the encoder and in the decoder."""
  return config.model.num_encoder_layers // unit_size(config), config.model.num_decoder_layers // unit_size(config)


def depth_points(units: tuple[int, int]) -> list[tuple[int, int]]:
  """The (encoder, decoder) unit counts to compile so that a step's cost, a + b x encoder units + c x decoder
  units, extends to `units`: (1, 1) and one deeper point per stack deeper than one unit."""
  ne, nd = units
  if ne == nd > 1:
    return [(1, 1), (2, 2)]
  return [(1, 1)] + [(2, 1)] * (ne > 1) + [(1, 2)] * (nd > 1)


def extend_to_depth(costs: dict[tuple[int, int], float], units: tuple[int, int]) -> float:
  """A cost at `units` from its values at `depth_points(units)`, each unit of a stack adding the same."""
  ne, nd = units
  base = costs[(1, 1)]
  if (2, 2) in costs:
    return base + (ne - 1) * (costs[(2, 2)] - base)
  return base + (ne - 1) * (costs.get((2, 1), base) - base) + (nd - 1) * (costs.get((1, 2), base) - base)


def step_time(config, devices, program, points: dict | None = None) -> dict:
  """The TPU compiler's cost of one step with every layer unit counted: unrolled compiles at `depth_points`,
  extended to the configured depth (with one unit per stack, `program`, the configured model compiled, is the
  only one). `points` keeps the costs compiled, by depth point, for a config that differs from this one only in
  depth (e.g. the paper's 12L and 36L models). {'seconds', 'flops' (per device), 'compiles' (new ones),
  'points': {'<encoder units>+<decoder units>': {'seconds', 'flops', 'uncounted_loops'}}}, where
  uncounted_loops are the loops of more than one iteration left in that program, whose bodies the compiler
  counted once (0 when exact)."""
  from gshard_mt.tools import hlo as hlo_lib
  from gshard_mt.tools import tpu

  def cost(program):
    c = tpu.compiler_cost(program)
    loops = sum(1 for t in hlo_lib.loops(program.as_text()).values() if t != 1)
    return {"seconds": c["optimal_seconds"], "flops": c["flops"], "uncounted_loops": loops}

  units, unit = unit_counts(config), unit_size(config)
  points = {} if points is None else points
  costs, compiles = {}, 0
  for ne, nd in depth_points(units):
    if units == (1, 1):  # otherwise the configured program's loops would count their bodies once
      costs[(ne, nd)] = cost(program)
      continue
    if (ne, nd) not in points:
      compiles += 1
      print(f"step time: compiling {ne} + {nd} unrolled layer units", file=sys.stderr, flush=True)
      points[(ne, nd)] = cost(compile_step(config_lib.apply_overrides(config.copy_and_resolve_references(), {
          "model.num_encoder_layers": str(ne * unit), "model.num_decoder_layers": str(nd * unit),
          "model.scan_layers": "False"}), devices)[2])
    costs[(ne, nd)] = points[(ne, nd)]
  return {"seconds": extend_to_depth({p: c["seconds"] for p, c in costs.items()}, units),
          "flops": extend_to_depth({p: c["flops"] for p, c in costs.items()}, units),
          "compiles": compiles, "points": {f"{ne}+{nd}": c for (ne, nd), c in costs.items()}}


def tpu_estimates(config, devices, program, params, with_time: bool, points: dict | None = None) -> dict:
  """FLOPs per device (loops counted), and with `with_time` the compiler's step time and from it steps/s,
  tokens/s (source and target) and a bound on MFU (the model's FLOPs, `metrics.step_flops`, over time x peak):
  all estimates of the TPU compiler, a lower bound on time, not measurements."""
  from gshard_mt.tools import tpu
  from gshard_mt.training import metrics

  chip = tpu.chip_of(devices[0].device_kind)
  est = tpu.estimate(program)
  sides = [config.batch_size * length for length in row_lengths(config)]  # token slots per side, all filled
  tokens, model_flops = sum(sides), metrics.step_flops(params, config.moe.num_experts, *sides)
  out = {"chip": chip.generation, "peak_flops_per_device": chip.peak_flops, "hbm_bytes_per_device": chip.hbm_bytes,
         "flops_per_device": est["flops"], "bytes_accessed_per_device": est["bytes accessed"],
         "compiler_flops_per_device": est["compiler_flops"], "tokens_per_step": tokens,
         "model_flops_per_step": model_flops}
  if with_time:
    t = step_time(config, devices, program, points)
    out.update(step_seconds=t["seconds"], step_flops_per_device=t["flops"], time_compiles=t["compiles"],
               depth_points=t["points"], steps_per_second=1 / t["seconds"],
               tokens_per_second=tokens / t["seconds"],
               mfu_bound=model_flops / (t["seconds"] * chip.peak_flops * len(devices)))
  return out


def markdown(report: dict, config_path: str) -> str:
  gib = lambda b: f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"  # noqa: E731
  m = report["per_device_bytes"]
  where = report.get("topology") or f"{report['devices']} fake CPU devices"
  lines = [f"# Dry run: {config_path} on {where}", "",
           f"{report['devices']} devices ({report['device_kind']}), mesh {report['mesh']}, rules "
           f"'{report['partitioning']}', {report['parameters'] / 1e6:,.1f}M parameters.",
           "", "| per device | bytes |", "|---|---|",
           f"| parameters | {gib(m['parameters'])} |", f"| optimizer state | {gib(m['optimizer_state'])} |",
           f"| arguments (XLA) | {gib(m['argument'])} |", f"| temporaries (XLA) | {gib(m['temp'])} |",
           f"| peak = arguments + outputs - aliased + temporaries | {gib(m['peak'])} |",
           f"| fits {report['hbm_gib']:g} GiB HBM? | {'yes' if report['fits'] else 'no'} |", "",
           f"Loops in the program (trip counts): {report['loop_trip_counts'] or 'none'}.", "",
           "| collective | per step | of which in MoE layers | bytes per device per step | ops in the program |",
           "|---|---|---|---|---|"]
  for kind, c in report["collectives"].items():
    lines.append(f"| {kind} | {c['count']} | {report['moe_collectives'][kind]['count']} | {gib(c['bytes'])} "
                 f"| {c['ops']} |")
  if est := report.get("estimate"):
    lines += ["", f"## Estimates of the TPU compiler ({est['chip']}): lower bounds on time, not measurements", "",
              "| per step | estimate |", "|---|---|",
              f"| FLOPs per device (loops counted) | {est['flops_per_device']:.4g} |",
              f"| FLOPs per device as cost_analysis() counts them (loop bodies once) | "
              f"{est['compiler_flops_per_device']:.4g} |",
              f"| HBM bytes accessed per device (loops counted) | {gib(est['bytes_accessed_per_device'])} |",
              f"| model FLOPs (6 x active parameters x tokens, {est['tokens_per_step']:,} tokens) | "
              f"{est['model_flops_per_step']:.4g} |"]
    if "step_seconds" in est:
      lines += [f"| step time (compiler's cost model) | {est['step_seconds']:.4g} s |",
                f"| steps/s | {est['steps_per_second']:.3g} |",
                f"| tokens/s | {est['tokens_per_second']:,.0f} |",
                f"| MFU, upper bound: model FLOPs / (time x {est['peak_flops_per_device'] / 1e12:g} TFLOP/s x "
                f"{report['devices']}) | {est['mfu_bound']:.1%} |", "",
                f"Step time: the compiler's cost of the model with 1 and 2 unrolled layer units per stack "
                f"({est['time_compiles']} more compiles), extended linearly to the configured depth; their FLOPs, so "
                f"extended, are {est['step_flops_per_device']:.4g} per device (loops left uncounted: "
                f"{sum(p['uncounted_loops'] for p in est['depth_points'].values())})."]
  lines += ["", f"Compiled per-device program: {report['hlo_instructions']:,} HLO instructions. "
            f"Lowering {report['lower_seconds']} s, compilation {report['compile_seconds']} s "
            + (f"(the TPU compiler, libtpu, for {report['topology']} on this host)." if report.get("topology")
               else f"(one CPU host, fake devices; XLA_FLAGS {report['xla_flags']!r})."), ""]
  return "\n".join(lines)


def plan(config_path: str, overrides: dict, topology: str | None = None, num_devices: int | None = None,
         hbm_gib: float | None = None, with_time: bool = True, points: dict | None = None,
         cpu_all_to_all: bool = False) -> dict:
  """The dry run of a config file for a TPU `topology` or `num_devices` fake CPU devices (set before JAX starts
  its CPU backend), with 'topology', 'hbm_gib' and 'fits' added to `dry_run`'s report."""
  if topology:
    from gshard_mt.tools import tpu

    devices = tpu.topology_devices(topology)
    hbm_gib = hbm_gib or tpu.chip_of(topology).hbm_bytes / 2**30
    config = load_for(config_path, overrides, len(devices))
  else:
    config = load_for(config_path, overrides, num_devices)
    hbm_gib = hbm_gib or 16.0
    if not cpu_all_to_all:  # read when the CPU backend starts, below
      os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {NO_CPU_ALL_TO_ALL_DECOMPOSER}".strip()
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", num_devices)
    if jax.device_count() != num_devices:
      raise UserError(f"JAX started with {jax.device_count()} devices, not {num_devices}: run the dry run in a "
                      "fresh process (JAX had started before it could ask for fake devices)")
    devices = jax.devices()
  report = dry_run(config, devices, with_time, points)
  report.update(topology=topology, hbm_gib=hbm_gib, xla_flags=os.environ.get("XLA_FLAGS", ""),
                fits=report["per_device_bytes"]["peak"] <= hbm_gib * 2**30)
  return report


def write(report: dict, config_path: str, out: io.PathLike):
  out = io.path(out)
  out.mkdir(parents=True, exist_ok=True)
  io.write_atomically(out / "dryrun.json", json.dumps(report, indent=2))
  io.write_atomically(out / "dryrun.md", markdown(report, config_path))


def main(argv):
  args, overrides = config_lib.split_overrides(argv)
  parser = cli.parser(__doc__, config=True)
  where = parser.add_mutually_exclusive_group(required=True)
  where.add_argument("--topology", help="a TPU topology, e.g. v3:32x32 (2,048 v3 cores), compiled by libtpu")
  where.add_argument("--devices", type=int, help="N fake CPU devices, compiled by XLA's CPU backend")
  parser.add_argument("--mesh", default="", help="e.g. data=1,expert=2048 (default: the config's mesh)")
  parser.add_argument("--hbm_gib", type=float, default=None,
                      help="HBM per device (default: the TPU generation's with --topology, else 16)")
  parser.add_argument("--require_fit", action="store_true", help="exit 1 when it does not fit the HBM")
  parser.add_argument("--no_step_time", action="store_true",
                      help="skip the compiles that estimate the step time (--topology)")
  parser.add_argument("--out", default=None, help="default: runs/dryrun/<config>-<topology or devices>")
  parser.add_argument("--cpu_all_to_all", action="store_true",
                      help="keep XLA's CPU all-to-all decomposer (compile time then grows with --devices)")
  parsed = parser.parse_args(args)
  for key, value in parse_mesh(parsed.mesh).items():
    overrides[f"mesh.{key}"] = str(value)
  name = (parsed.topology or str(parsed.devices)).replace(":", "-")
  out = io.path(parsed.out or f"runs/dryrun/{pathlib.Path(parsed.config).stem}-{name}")  # its scheme: before compiling
  report = plan(parsed.config, overrides, parsed.topology, parsed.devices, parsed.hbm_gib, not parsed.no_step_time,
                cpu_all_to_all=parsed.cpu_all_to_all)
  write(report, parsed.config, out)
  print(markdown(report, parsed.config))
  print(f"wrote {out}/dryrun.json and dryrun.md")
  if not report["fits"]:
    need = report["per_device_bytes"]["peak"] / 2**30
    print(f"does NOT fit: {need:.2f} GiB per device needed, {report['hbm_gib']:g} GiB available")
    if parsed.require_fit:
      sys.exit(1)


if __name__ == "__main__":
  cli.run(main, prog="python -m gshard_mt.tools.dryrun")

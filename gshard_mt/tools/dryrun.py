"""Plan a run before renting the pod: compile the whole training step, without allocating anything, either with
the real TPU compiler for a TPU topology (libtpu; no TPU needed) or with XLA's CPU compiler for N fake devices.
Reports per-device memory, the collectives of one step (loop iterations counted) and the compile time; for a
TPU topology also FLOPs per device and the compiler's estimated step time, tokens/s and a bound on MFU.

  python -m gshard_mt.tools.dryrun --config configs/moe_2048e_36l.py --topology v3:32x32 [--mesh data=1,expert=2048]
  python -m gshard_mt.tools.dryrun --config configs/moe_2048e_36l.py --devices 2048 [--hbm_gib 16]
                             [--require_fit] [--no_step_time] [--remat_policies none,full,dots]
                             [--out runs/dryrun/...] [--config.key=value ...]

Writes dryrun.json and dryrun.md into --out. Exits non-zero only with --require_fit when it does not fit.
HBM per device: the chip's (gshard_mt/parallel/chips.py) with --topology, else --hbm_gib (default 16).
--remat_policies compiles the step again with each other model.remat policy and reports its peak memory (and,
for a TPU topology, its estimated step time) beside the configured one's.

The step time is the TPU compiler's estimate, a lower bound on time, not a measurement: that of the configured
program when its layers are unrolled, else taken from more compiles with unrolled layers
(gshard_mt.tpu.estimates.step_cost); --no_step_time skips them.

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

import jax

from gshard_mt import cli, io
from gshard_mt import config as config_lib
from gshard_mt.errors import ConfigError, UserError
from gshard_mt.model.transformer import REMAT_POLICIES
from gshard_mt.parallel import chips
from gshard_mt.parallel import mesh as mesh_lib
from gshard_mt.tpu.estimates import hlo as hlo_lib
from gshard_mt.tpu.estimates import step_cost
from gshard_mt.tpu.estimates import tpu_compiler as tpu

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


def parse_remat_policies(text: str) -> list[str]:
  """'none,full' -> ['none', 'full'], each a key of model.REMAT_POLICIES."""
  policies = [p for p in text.split(",") if p]
  if unknown := [p for p in policies if p not in REMAT_POLICIES]:
    raise ConfigError(f"--remat_policies {text!r}: unknown {unknown}; expected some of {tuple(REMAT_POLICIES)}")
  return policies


def fit_group_size(config, num_devices: int) -> int | None:
  """When the MoE groups of a microbatch do not work on this mesh (`config.moe_group_error`), the largest
  moe.group_size below the configured one that works (None: the configured one works, or nothing smaller does)."""
  group_devices = mesh_lib.devices_of(config, num_devices, "group")
  if config_lib.moe_group_error(config, group_devices) is None:
    return None
  tokens = max(config_lib.microbatch_rows(config) * length for length in config_lib.row_lengths(config))
  size = next((s for s in range(min(config.moe.group_size, tokens), 0, -1)
               if config_lib.moe_group_error(config, group_devices, s) is None), None)
  return size


def fit_to_mesh(config, num_devices: int) -> tuple[object, dict[str, list]]:
  """(the config with its MoE group size fitted to a mesh of `num_devices` if needed, {key: [configured, used]} of
  the settings that changed)."""
  changed = {}
  if (size := fit_group_size(config, num_devices)) is not None:
    changed["moe.group_size"] = [config.moe.group_size, size]
    config = config_lib.replace(config, {"moe.group_size": size})
  mesh_lib.check(config, num_devices)
  return config, changed


def describe_changes(changed: dict[str, list]) -> str:
  """'moe.group_size=128 does not split over this mesh; using moe.group_size=16' (each change, '; ' between)."""
  return "; ".join(f"{key}={was} does not split over this mesh; using {key}={now}"
                   for key, (was, now) in changed.items())


def load_for(config_path: str, overrides: dict, num_devices: int):
  """The config for a plan on `num_devices`, fitted to the mesh (`fit_to_mesh`; a change said on stderr)."""
  config, changed = fit_to_mesh(cli.load(config_path, overrides), num_devices)
  if changed:
    print(describe_changes(changed), file=sys.stderr)
  return config


def dry_run(config, devices, with_time: bool = True, points: dict | None = None) -> dict:
  """Lowers and compiles one training step for `devices` from abstract values; returns the report. For TPU
  devices it has 'estimate': FLOPs and, with `with_time`, the compiler's step time (`step_cost.tpu_estimates`;
  `points` as in `step_cost.step_time`)."""
  say(f"lowering and compiling the training step for {len(devices)} {devices[0].device_kind} devices")
  setup, state, program, lower_s, compile_s = step_cost.compile_step(config, devices)
  say(f"lowered in {lower_s:.1f} s, compiled in {compile_s:.1f} s")
  n_params = sum(int(x.size) for x in jax.tree.leaves(state.params))
  hlo = program.as_text()
  expert_shapes = {leaf.shape[-3:] for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]
                   if re.search(r"\['moe'\]\['w[io]'\]$", jax.tree_util.keystr(path))}
  report = {
      "devices": len(devices), "device_kind": devices[0].device_kind,
      "mesh": dict(zip(mesh_lib.MESH_AXES, setup.mesh.devices.shape)),
      "partitioning": config.partitioning, "parameters": n_params, "remat": config.model.remat,
      "num_microbatches": config.num_microbatches,
      "per_device_bytes": {
          "parameters": hlo_lib.per_device_bytes(state.params, setup.state_shardings.params),
          "optimizer_state": hlo_lib.per_device_bytes(state.opt_state, setup.state_shardings.opt_state),
          **hlo_lib.memory(program)},
      "collectives": hlo_lib.collectives(hlo),
      "moe_collectives": hlo_lib.collectives(hlo, op_name="/moe/"),
      "loop_trip_counts": sorted(hlo_lib.loops(hlo).values(), key=lambda t: (t is None, t)),
      "expert_weight_gathers": hlo_lib.gathers_of(hlo, expert_shapes),
      "hlo_instructions": hlo_lib.instruction_count(hlo),
      # Pallas kernels for TPUs (Mosaic custom calls): none unless a kernel option asks for one
      "pallas_calls": hlo.count('custom_call_target="tpu_custom_call"'),
      "lower_seconds": round(lower_s, 2), "compile_seconds": round(compile_s, 2),
  }
  if devices[0].platform == "tpu":
    started = time.perf_counter()
    if with_time:
      say("estimating the step time with the TPU compiler's cost model (more compiles)")
    report["estimate"] = step_cost.tpu_estimates(config, devices, program, state.params, with_time, points)
    if with_time:
      say(f"estimated in {time.perf_counter() - started:.1f} s")
  return report


def say(what: str):
  """A line on standard error as a long step starts or ends (standard output is the report)."""
  print(f"dry run: {what}", file=sys.stderr, flush=True)


def remat_policies(config, devices, report: dict, policies: list[str], with_time: bool) -> dict:
  """{policy: {'peak', 'temp' (bytes per device), 'step_seconds' (TPU with `with_time`, else None), 'compile_seconds'}}
  of the step compiled with each model.remat policy; the configured policy's is `report`'s."""
  out = {}
  for policy in policies:
    if policy != config.model.remat:
      print(f"model.remat={policy}: compiling the step", file=sys.stderr, flush=True)
    r = report if policy == config.model.remat else dry_run(
        config_lib.replace(config, {"model.remat": policy}), devices, with_time)
    out[policy] = {"peak": r["per_device_bytes"]["peak"], "temp": r["per_device_bytes"]["temp"],
                   "step_seconds": r.get("estimate", {}).get("step_seconds"), "compile_seconds": r["compile_seconds"]}
  return out


def markdown(report: dict, config_path: str) -> str:
  gib = lambda b: f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"  # noqa: E731
  m = report["per_device_bytes"]
  where = report.get("topology") or f"{report['devices']} fake CPU devices"
  lines = [f"# Dry run: {config_path} on {where}", "",
           f"{report['devices']} devices ({report['device_kind']}), mesh {report['mesh']}, rules "
           f"'{report['partitioning']}', {report['parameters'] / 1e6:,.1f}M parameters, model.remat "
           f"'{report['remat']}', {report['num_microbatches']} microbatch(es).",
           *(["", f"**Changed from the config**: {describe_changes(report['changed'])}; this report is of the "
                  "changed config."] if report.get("changed") else []),
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
                step_cost.step_time_note(est)]
  if policies := report.get("remat_policies"):
    lines += ["", "| model.remat | peak per device | temporaries | step time (compiler's estimate) | compile s |",
              "|---|---|---|---|---|"]
    for name, r in policies.items():
      step = "-" if r["step_seconds"] is None else f"{r['step_seconds'] * 1e3:.2f} ms"
      lines.append(f"| {name} | {gib(r['peak'])} | {gib(r['temp'])} | {step} | {r['compile_seconds']} |")
  lines += ["", f"Compiled per-device program: {report['hlo_instructions']:,} HLO instructions. "
            f"Lowering {report['lower_seconds']} s, compilation {report['compile_seconds']} s "
            + (f"(the TPU compiler, libtpu, for {report['topology']} on this host; LIBTPU_INIT_ARGS "
               f"{report.get('libtpu_flags', '')!r})." if report.get("topology")
               else f"(one CPU host, fake devices; XLA_FLAGS {report['xla_flags']!r})."), ""]
  return "\n".join(lines)


def plan(config_path: str, overrides: dict, topology: str | None = None, num_devices: int | None = None,
         hbm_gib: float | None = None, with_time: bool = True, points: dict | None = None,
         cpu_all_to_all: bool = False, remat: list[str] = ()) -> dict:
  """The dry run of a config file for a TPU `topology` or `num_devices` fake CPU devices (set before JAX starts
  its CPU backend), with 'topology', 'hbm_gib', 'fits' and 'changed' (the settings fitted to the mesh,
  `fit_to_mesh`) added to `dry_run`'s report, and with `remat` policies their `remat_policies`."""
  asked = cli.load(config_path, overrides)
  if topology:
    devices = tpu.topology_devices(topology)
    hbm_gib = hbm_gib or chips.hbm_bytes(devices[0]) / 2**30
    config, changed = fit_to_mesh(asked, len(devices))
  else:
    config, changed = fit_to_mesh(asked, num_devices)
    hbm_gib = hbm_gib or 16.0
    if not cpu_all_to_all:  # read when the CPU backend starts, below
      os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {NO_CPU_ALL_TO_ALL_DECOMPOSER}".strip()

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", num_devices)
    if jax.device_count() != num_devices:
      raise UserError(f"JAX started with {jax.device_count()} devices, not {num_devices}: run the dry run in a "
                      "fresh process (JAX had started before it could ask for fake devices)")
    devices = jax.devices()
  if changed:
    say(describe_changes(changed))
  report = dry_run(config, devices, with_time, points) | {"changed": changed}
  if remat:
    report["remat_policies"] = remat_policies(config, devices, report, remat, with_time)
  report.update(topology=topology, hbm_gib=hbm_gib, xla_flags=os.environ.get("XLA_FLAGS", ""),
                libtpu_flags=os.environ.get("LIBTPU_INIT_ARGS", ""),
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
  parser.add_argument("--remat_policies", default="", help="e.g. none,full,dots: compile and compare each")
  parser.add_argument("--out", default=None, help="default: runs/dryrun/<config>-<topology or devices>")
  parser.add_argument("--cpu_all_to_all", action="store_true",
                      help="keep XLA's CPU all-to-all decomposer (compile time then grows with --devices)")
  parsed = parser.parse_args(args)
  if parsed.devices is not None and parsed.devices < 1:
    raise UserError(f"--devices must be at least 1, got {parsed.devices}")
  for key, value in parse_mesh(parsed.mesh).items():
    overrides[f"mesh.{key}"] = str(value)
  remat = parse_remat_policies(parsed.remat_policies)
  name = (parsed.topology or str(parsed.devices)).replace(":", "-")
  out = io.check_writable(parsed.out or f"runs/dryrun/{pathlib.Path(parsed.config).stem}-{name}",
                         "output directory", create=False)  # before compiling; created when written
  report = plan(parsed.config, overrides, parsed.topology, parsed.devices, parsed.hbm_gib, not parsed.no_step_time,
                cpu_all_to_all=parsed.cpu_all_to_all, remat=remat)
  write(report, parsed.config, out)
  print(markdown(report, parsed.config))
  print(f"wrote {out}/dryrun.json and dryrun.md")
  if not report["fits"]:
    need = report["per_device_bytes"]["peak"] / 2**30
    print(f"does NOT fit: {need:.2f} GiB per device needed, {report['hbm_gib']:g} GiB available")
    if parsed.require_fit:
      sys.exit(1)


if __name__ == "__main__":
  # Without the compilation cache: the report's compile time is a measurement, which a cached program would hide.
  cli.run(main, cache=False)

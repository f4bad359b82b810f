"""Where a training step's time goes, measured on the machine it runs on: a `jax.profiler` trace of a few warmed-up
steps, each device operation's time summed by part of the model (`gshard_mt.tpu.estimates.parts`: the parts of
bench/step_breakdown.py's TPU estimate), the matmuls' share of each part, and the time the device sat idle
between operations (waiting for the host).

  python bench/profile_step.py --config configs/dense_base.py [--warmup 3] [--steps 5] [--config.key=value ...]
  python bench/profile_step.py --config configs/base.py --small    # gpu_suite's CPU-sized shapes, on the CPU

`make bench-gpu` (bench/gpu_suite.py) runs it for configs/base.py and configs/dense_base.py in the same run as the
suite's other sections.

The step is compiled once; its program text gives every HLO instruction a part (from the JAX operation and the
stack frame in its metadata) and says whether it is a matmul (a dot, a cuBLAS call, a fusion around a dot). The
trace is written to a temporary folder and read back as a `ProfileData` (no TensorFlow needed; JAX 0.11, which GPU
images carry, has no in-memory trace).
Operations are the events that name an `hlo_op` of the step's module: on a GPU the kernels on the first device's
plane (`/device:GPU:0`; every device runs the same program), one line per stream (the command line turns XLA's
command buffers off, which would otherwise show as one event each, as with JAX 0.11 on an H100); on the CPU the
XLA thunks on the host's threads. Each event counts its own time, less that of the events nested in it on its
line, so the parts sum to the operations' time. Streams or threads that run at once each count: `overlap` is how
much the operations' time exceeds the time some operation ran. Idle: the traced window (the first operation's
start to the last one's end) less the time some operation ran. `top` lists the longest instructions with their
part and JAX operation. All per step. A traced step runs somewhat slower than an untraced one (the profiler's own
work, no command buffers); the suite times its steps untraced.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import re
import sys
import tempfile
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402

from gshard_mt import (  # noqa: E402
  cli,
  io,
  xla_flags,
)
from gshard_mt import config as config_lib  # noqa: E402
from gshard_mt.data import pipeline  # noqa: E402
from gshard_mt.errors import UserError  # noqa: E402
from gshard_mt.model.transformer import Transformer  # noqa: E402
from gshard_mt.parallel import distributed  # noqa: E402
from gshard_mt.tpu.estimates import parts  # noqa: E402
from gshard_mt.training.setup import build  # noqa: E402

IDLE = "idle: the device waits (for the host)"
DEVICE_PLANES = ("/device:GPU:", "/device:TPU:")  # without them (the CPU backend), the host's planes
TOP, TOP_NAME = 12, 90  # the longest instructions listed, and the end of their JAX operation's name kept
# XLA's GPU command buffers (CUDA graphs) show in a trace as one event each, hiding the kernels inside them: off
# while profiling.
NO_COMMAND_BUFFERS = (("xla_gpu_enable_command_buffer", ""),)


@dataclasses.dataclass(frozen=True)
class Event:
  """One operation as the trace shows it: where it ran (plane, line), when, and its HLO instruction."""

  line: tuple[str, str]
  start_ns: float
  end_ns: float
  op: str


def op_events(planes, module: str) -> list[Event]:
  """The events of `module`'s HLO operations on the first device plane of a trace that has any (every device runs
  the same program), else (the CPU) on the host's planes."""
  planes = sorted(planes, key=lambda p: p.name)
  for plane in [p for p in planes if p.name.startswith(DEVICE_PLANES)]:
    if events := _module_events([plane], module):
      return events
  return _module_events(planes, module)


def _module_events(planes, module: str) -> list[Event]:
  events = []
  for plane in planes:
    for line in plane.lines:
      for e in line.events:
        with warnings.catch_warnings():  # jaxlib's stats type warns on Python 3.13 when first made
          warnings.simplefilter("ignore", DeprecationWarning)
          stats = {key: value for key, value in e.stats}
        if stats.get("hlo_module") == module and "hlo_op" in stats:
          events.append(Event((plane.name, line.name), e.start_ns, e.end_ns, str(stats["hlo_op"])))
  return events


def own_times(events: list[Event]) -> list[float]:
  """Each event's duration less that of the events nested directly in it on its line (a thunk that runs others)."""
  own = [e.end_ns - e.start_ns for e in events]
  lines = collections.defaultdict(list)
  for i, e in enumerate(events):
    lines[e.line].append(i)
  for ids in lines.values():
    ids.sort(key=lambda i: (events[i].start_ns, -events[i].end_ns))
    stack = []
    for i in ids:
      while stack and events[stack[-1]].end_ns <= events[i].start_ns:
        stack.pop()
      if stack:
        own[stack[-1]] -= min(events[i].end_ns, events[stack[-1]].end_ns) - events[i].start_ns
      stack.append(i)
  return own


def busy_ns(events: list[Event]) -> float:
  """The time at least one event runs."""
  total, end = 0.0, float("-inf")
  for start, stop in sorted((e.start_ns, e.end_ns) for e in events):
    if stop > end:
      total += stop - max(start, end)
      end = stop
  return total


def summarize(events: list[Event], ops: dict[str, dict], steps: int) -> dict:
  """Per step: ms and matmul ms of each part (and idle), their shares, and the totals. `ops` maps instruction names
  to `parts.instructions`' rows; an operation the program does not name is classified by its opcode alone and
  listed in `unknown_ops`."""
  per_part = collections.defaultdict(lambda: [0.0, 0.0])  # part: [ns, matmul ns] over all traced steps
  per_op = collections.Counter()  # instruction: ns over all traced steps
  part_of_op = {}
  unknown = set()
  for e, ns in zip(events, own_times(events)):
    op = ops.get(e.op)
    if op is None:
      unknown.add(e.op)
      op = dict(part=parts.part_of(("", ""), "", re.sub(r"\.\d+$", "", e.op)), matmul=False)
    per_part[op["part"]][0] += ns
    per_part[op["part"]][1] += ns if op["matmul"] else 0.0
    per_op[e.op] += ns
    part_of_op[e.op] = op["part"]
  window, busy = max(e.end_ns for e in events) - min(e.start_ns for e in events), busy_ns(events)
  operations = sum(ns for ns, _ in per_part.values())
  per_part[IDLE] = [window - busy, 0.0]
  total, ms = operations + window - busy, 1e-6 / steps  # ns in all traced steps -> ms per step
  rows = {name: dict(ms=per_part[name][0] * ms, matmul_ms=per_part[name][1] * ms, share=per_part[name][0] / total)
          for name in [name for name, _ in parts.PARTS] + [IDLE] if name in per_part}
  return dict(steps=steps, events=len(events), unknown_ops=sorted(unknown), window_ms=window * ms,
              op_ms=operations * ms, busy_ms=busy * ms, overlap_ms=(operations - busy) * ms,
              idle_ms=(window - busy) * ms, matmul_ms=sum(m for _, m in per_part.values()) * ms, parts=rows,
              top=[dict(op=name, ms=ns * ms, part=part_of_op[name],
                        op_name=ops.get(name, {}).get("op_name", "")[-TOP_NAME:])
                   for name, ns in per_op.most_common(TOP)])


def trace_steps(step, state, batches: list, warmup: int) -> dict:
  """Runs the compiled train step `step` on the first `warmup` batches, then traces it on the rest: their summary."""
  for batch in batches[:warmup]:
    state, _ = step(state, batch)
  jax.block_until_ready(state)
  with tempfile.TemporaryDirectory() as log_dir:
    with jax.profiler.trace(log_dir):
      for batch in batches[warmup:]:
        state, _ = step(state, batch)
      jax.block_until_ready(state)
    (xplane,) = pathlib.Path(log_dir).rglob("*.xplane.pb")
    profile_data = jax.profiler.ProfileData.from_file(str(xplane))
  text = step.as_text()
  module = re.match(r"HloModule ([\w.\-]+)", text).group(1)
  events = op_events(profile_data.planes, module)
  if not events:
    raise RuntimeError(f"the trace shows no operation of {module} (no per-operation events on this backend?)")
  return summarize(events, parts.instructions(text), len(batches) - warmup)


def profile(config, data: pipeline.Data, setup, warmup: int, steps: int) -> dict:
  """The summary of `steps` traced train steps of `config` (a fresh state, its own packed training batches, staged
  on the device beforehand), after `warmup` untraced ones."""
  state = setup.init_state(config.seed)
  batches = data.train_batches(config)
  with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
    staged = [distributed.global_batch(next(batches)[1], setup.mesh, setup.rules) for _ in range(warmup + steps)]
    step = setup.jit_train_step(Transformer(setup.model_cfg, deterministic=False), config).lower(
        state, staged[0]).compile()
    return trace_steps(step, state, staged, warmup)


def table(profiles: dict[str, dict]) -> str:
  """Markdown: the parts, then ms per step, share and matmul ms of each profile of {label: summary}."""
  lines = ["| part | " + " | ".join(f"{label} ms | share | matmuls ms" for label in profiles) + " |",
           "|---|" + "---|---|---|" * len(profiles)]
  for name in [name for name, _ in parts.PARTS] + [IDLE]:
    if any(name in p["parts"] for p in profiles.values()):
      rows = [p["parts"].get(name) for p in profiles.values()]
      lines.append(f"| {name} | " + " | ".join(f"{r['ms']:.2f} | {r['share']:.0%} | {r['matmul_ms']:.2f}" if r
                                               else " | | " for r in rows) + " |")
  lines.append("| all | " + " | ".join(f"{p['op_ms'] + p['idle_ms']:.2f} | 100% | {p['matmul_ms']:.2f}"
                                       for p in profiles.values()) + " |")
  return "\n".join(lines) + "\n"


def top_table(p: dict) -> str:
  """Markdown: the longest instructions of a summary, with their part and the end of their JAX operation's name."""
  return "\n".join(["| instruction | ms per step | part | JAX operation (end) |", "|---|---|---|---|"] + [
      f"| {t['op']} | {t['ms']:.2f} | {t['part']} | `{t['op_name']}` |" for t in p["top"]]) + "\n"


def describe(label: str, p: dict) -> str:
  """One line: the traced window, operations, overlap and idle time per step of a summary."""
  return (f"{label}: {p['steps']} traced steps, {p['window_ms']:.2f} ms per step from the first operation to the "
          f"last; operations {p['op_ms']:.2f} ms ({p['overlap_ms']:.2f} ms of it at once on several streams or "
          f"threads), idle {p['idle_ms']:.2f} ms; {p['events'] // p['steps']} operations per step")


def main(argv):
  args, overrides = config_lib.split_overrides(argv)
  parser = cli.parser(__doc__, config=True)
  parser.add_argument("--warmup", type=int, default=3, help="untraced steps first (the step is compiled before)")
  parser.add_argument("--steps", type=int, default=5, help="traced steps")
  parser.add_argument("--small", action="store_true", help="gpu_suite's CPU-sized configs, on the CPU")
  parser.add_argument("--json", default="", help="also write the summary to this file")
  parsed = parser.parse_args(args)
  if parsed.steps < 1 or parsed.warmup < 0:
    raise UserError(f"--steps must be at least 1 and --warmup at least 0, not {parsed.steps} and {parsed.warmup}")
  import gpu_suite  # bench/gpu_suite.py: its CPU-sized shapes and backend

  if parsed.small:
    gpu_suite.small_backend()
  else:
    xla_flags.add(NO_COMMAND_BUFFERS)
  config = cli.load(parsed.config, {**(gpu_suite.SMALL if parsed.small else {}), **overrides})
  gpu_suite.mesh_lib.check(config, jax.device_count())
  with tempfile.TemporaryDirectory() as workdir:
    data = pipeline.load(config, pathlib.Path(workdir))
    summary = profile(config, data, build(config, data.tokenizer.vocab_size), parsed.warmup, parsed.steps)
  print(f"\n{describe(parsed.config, summary)}\n\n{table({parsed.config: summary})}\n{top_table(summary)}")
  if parsed.json:
    io.write_atomically(parsed.json, json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
  cli.run(main)

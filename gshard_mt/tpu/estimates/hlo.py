"""What a compiled XLA program does per step: its collectives (kind, executions, bytes) and per-device memory.

Collectives inside loops (the scanned layers) run once per iteration: each computation's execution count is
its callers' count times the loop's trip count, read from the HLO text. The CPU compiler writes the trip count
into the loop (`known_trip_count`); the TPU compiler does not, and its loops read `i < N` with i starting from a
constant, so the count is N minus that start (JAX's loops step by one).

XLA's cost analysis (`compiled.cost_analysis()`, the same on every backend for FLOPs and bytes) counts a loop
body once, whatever its trip count; `costs` counts each body as often as it runs.
"""

from __future__ import annotations

import collections
import functools
import re

import jax
import numpy as np
from jax._src.lib import _jax
from jaxlib import _hlo

COLLECTIVES = ("all-to-all", "all-gather", "all-reduce", "reduce-scatter", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8}
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = (.*?) (" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_CALLEE = re.compile(r"(?:body|condition|to_apply|calls)=%?([\w.\-]+)")
_WHILE = re.compile(r" while\(%?([\w.\-]+)\), condition=%?([\w.\-]+), body=%?([\w.\-]+)")
# The cost a Pallas kernel declares (pl.CostEstimate), in its custom call's backend config.
DECLARED = re.compile(r'"cost_estimate":\{"flops":"(?P<flops>\d+)","transcendentals":"(?P<transcendentals>\d+)",'
                      r'"bytes_accessed":"(?P<bytes>\d+)"')
_NAME = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = ")
_CONSTANT = re.compile(r" constant\((-?\d+)\)")
_FORWARD = re.compile(r" (?:copy|bitcast|convert)\(%?([\w.\-]+)\)")  # ops that pass a loop counter on
_LESS_THAN = re.compile(r" compare\(%?([\w.\-]+), %?([\w.\-]+)\), direction=LT")
_INDEX = re.compile(r" get-tuple-element\(.*\), index=(\d+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_ANY_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = ", re.MULTILINE)
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_SHAPE = re.compile(r"(pred|[suf]\d+|bf16)\[([\d,]*)\]")


def shape_bytes(text: str) -> int:
  """Bytes of an HLO result type such as `f32[8,16]{1,0}` or a tuple of them."""
  total = 0
  for dtype, dims in _SHAPE.findall(text):
    total += _BYTES.get(dtype, 4) * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
  return total


def _computations(hlo: str) -> tuple[dict[str, list[str]], str]:
  comps, entry, name = {}, None, None
  for line in hlo.splitlines():
    m = _COMPUTATION.match(line)
    if m and not line[0].isspace():  # headers start at column 0; instructions are indented
      name = m.group(1)
      comps[name] = []
      if line.startswith("ENTRY"):
        entry = name
    elif name is not None:
      comps[name].append(line)
  return comps, entry


def _definitions(lines: list[str]) -> dict[str, str]:
  return {m.group(1): line for line in lines if (m := _NAME.match(line))}


def _constant(definitions: dict[str, str], name: str) -> int | None:
  """The integer constant that `name` is, through copies and bitcasts; None if it is not one."""
  for _ in range(8):
    line = definitions.get(name, "")
    if m := _CONSTANT.search(line):
      return int(m.group(1))
    if not (m := _FORWARD.search(line)):
      return None
    name = m.group(1)
  return None


def trip_count(comps: dict[str, list[str]], caller: dict[str, str], line: str) -> int | None:
  """Iterations of the while loop `line` (an instruction of the computation whose definitions are `caller`);
  None when neither form is found."""
  if m := _TRIP.search(line):
    return int(m.group(1))
  init, condition, _ = _WHILE.search(line).groups()
  cond = _definitions(comps.get(condition, []))
  if (less := _less_than(comps, comps.get(condition, []))) is None:
    return None
  bound = _constant(cond, less[1])
  index = _INDEX.search(cond.get(less[0], ""))
  operands = _operands("tuple", caller.get(init, ""))
  if bound is None or index is None or operands is None:
    return None
  start = _constant(caller, operands[int(index.group(1))])
  return None if start is None else max(bound - start, 0)


def _operands(op: str, line: str) -> list[str] | None:
  m = re.search(rf" {op}\(([^)]*)\)", line)
  return [x.strip().lstrip("%") for x in m.group(1).split(",")] if m else None


def _less_than(comps: dict[str, list[str]], lines: list[str]) -> tuple[str, str] | None:
  """(a, b) when the root of the computation `lines` is a < b, computed directly or by a fusion (as the CPU
  compiler writes it); a and b are the computation's own instructions."""
  root = next((x for x in lines if x.lstrip().startswith("ROOT ")), "")
  if less := _LESS_THAN.search(root):
    return less.group(1), less.group(2)
  operands, callee = _operands("fusion", root), _CALLEE.search(root)
  if operands is None or callee is None or (inner := _less_than(comps, comps.get(callee.group(1), []))) is None:
    return None
  fused = _definitions(comps[callee.group(1)])
  numbers = [re.search(r" parameter\((\d+)\)", fused.get(name, "")) for name in inner]
  return None if None in numbers else tuple(operands[int(n.group(1))] for n in numbers)


def _callees(line: str) -> list[str]:
  return _CALLEE.findall(line) + [c.strip().lstrip("%") for b in _BRANCHES.findall(line) for c in b.split(",")]


def loops(hlo: str) -> dict[str, int | None]:
  """{loop body computation: trip count (None: not readable)} for every while loop of the program."""
  comps, _ = _computations(hlo)
  out = {}
  for lines in comps.values():
    definitions = None
    for line in lines:
      if m := _WHILE.search(line):
        definitions = definitions or _definitions(lines)
        out[m.group(3)] = trip_count(comps, definitions, line)
  return out


def runs(hlo: str) -> collections.Counter:
  """{computation: executions per step}: a loop's body and condition run its trip count (1 if unreadable) times
  per execution of the computation holding the loop."""
  comps, entry = _computations(hlo)
  trips = loops(hlo)
  out = collections.Counter({entry: 1})
  order, seen = [entry], {entry}
  while order:
    name = order.pop(0)
    for line in comps.get(name, []):
      loop = _WHILE.search(line)
      times = (trips[loop.group(3)] or 1) if loop else 1
      for callee in _callees(line):
        out[callee] += out[name] * times
        if callee not in seen:
          seen.add(callee)
          order.append(callee)
  return out


def costs(hlo: str) -> dict[str, float]:
  """{'flops', 'bytes accessed', 'transcendentals'} of one execution of the program, each loop body counted as
  often as it runs (XLA's own analysis counts it once). XLA's cost analysis runs on the program with each loop
  body in turn as its entry: a computation's true cost is its analysed cost plus, for each loop it holds,
  (trip count x the body's true cost - the body's analysed cost). XLA's analysis counts no FLOPs in a custom call:
  those a Pallas kernel declares are added (its bytes XLA counts as the call's operands and results)."""
  comps, entry = _computations(hlo)
  trips = loops(hlo)
  text = hlo.split("\n", 1)[1]  # without the module header, whose entry layout and aliasing name the old entry
  client = jax.devices("cpu")[0].client  # XLA's cost analysis is the same for any backend's program
  keys = ("flops", "bytes accessed", "transcendentals")

  @functools.cache
  def analysed(name):
    moved = re.sub(r"^ENTRY ", "", text, count=1, flags=re.MULTILINE)
    moved = re.sub(rf"^%?{re.escape(name)} ", lambda m: "ENTRY " + m.group(0), moved, count=1, flags=re.MULTILINE)
    c = _jax.hlo_module_cost_analysis(client, _hlo.hlo_module_from_text(f"HloModule {name}\n{moved}"))
    kernels = [DECLARED.search(line) for line in scope(name)[1]]
    return np.array([float(c.get(k, 0.0)) for k in keys]) + sum(
        (np.array([float(m["flops"]), 0.0, float(m["transcendentals"])]) for m in kernels if m), np.zeros(len(keys)))

  @functools.cache
  def scope(name):
    """(the loops run by `name`, the lines of `name` and of what it calls), directly or through calls, fusions
    and branches, not through loops."""
    found, lines, order, seen = [], [], [name], {name}
    while order:
      for line in comps.get(order.pop(), []):
        if loop := _WHILE.search(line):
          found.append(loop.group(3))
          continue
        lines.append(line)
        for callee in _callees(line):
          if callee not in seen:
            seen.add(callee)
            order.append(callee)
    return found, lines

  @functools.cache
  def true_cost(name):
    return analysed(name) + sum(((trips[body] or 1) * true_cost(body) - analysed(body) for body in scope(name)[0]),
                                np.zeros(len(keys)))

  return dict(zip(keys, (float(v) for v in true_cost(entry))))


def collectives(hlo: str, op_name: str = "") -> dict[str, dict]:
  """{kind: {'count': executions per step, 'bytes': per-device result bytes per step, 'ops': static count}}; with
  `op_name`, only of the collectives whose metadata op_name contains it (e.g. '/moe/': those of the MoE layers,
  not those the SPMD partitioner adds to reshard other tensors)."""
  comps, _ = _computations(hlo)
  executions = runs(hlo)
  out = {kind: {"count": 0, "bytes": 0, "ops": 0} for kind in COLLECTIVES}
  for name, lines in comps.items():
    for line in lines:
      m = _INSTRUCTION.match(line)
      if m and executions[name] and (not op_name or op_name in _op_name(line)):
        kind = m.group(2)
        out[kind]["ops"] += 1
        out[kind]["count"] += executions[name]
        out[kind]["bytes"] += executions[name] * shape_bytes(m.group(1))
  return out


def _op_name(line: str) -> str:
  m = re.search(r'op_name="([^"]*)"', line)
  return m.group(1) if m else ""


def instruction_count(hlo: str) -> int:
  """Instructions in the program text: the per-device program's size, which SPMD keeps flat in the device count."""
  return len(_ANY_INSTRUCTION.findall(hlo))


def memory(compiled) -> dict[str, int]:
  """Per-device bytes from XLA's memory analysis; `peak` = arguments + outputs - aliased + temporaries."""
  m = compiled.memory_analysis()
  out = {k: int(getattr(m, f"{k}_size_in_bytes", 0) or 0) for k in ("argument", "output", "alias", "temp")}
  out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
  return out


def per_device_bytes(abstract_tree, shardings) -> int:
  """Bytes of one device's shards of a tree of ShapeDtypeStructs placed with `shardings`."""
  total = 0
  for leaf, sharding in zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(shardings)):
    total += int(np.prod(sharding.shard_shape(leaf.shape))) * leaf.dtype.itemsize
  return total


def gathers_of(hlo: str, shapes) -> int:
  """All-gathers in the program whose result ends with one of `shapes` (e.g. a whole expert weight [E, M, H])."""
  found = 0
  for line in hlo.splitlines():
    m = _INSTRUCTION.match(line)
    if m and m.group(2) == "all-gather":
      for _, dims in _SHAPE.findall(m.group(1)):
        d = tuple(int(x) for x in dims.split(",") if x)
        found += any(len(d) >= len(s) and d[len(d) - len(s):] == tuple(s) for s in shapes)
  return found

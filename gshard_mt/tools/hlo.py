"""What a compiled XLA program does per step: its collectives (kind, executions, bytes) and per-device memory.

Collectives inside loops (the scanned layers) run once per iteration: each computation's execution count is
its callers' count times the loop's known trip count, read from the HLO text.
"""

from __future__ import annotations

import collections
import re

import numpy as np

COLLECTIVES = ("all-to-all", "all-gather", "all-reduce", "reduce-scatter", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8}
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = (.*?) (" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_CALLEE = re.compile(r"(?:body|condition|to_apply|calls)=%?([\w.\-]+)")
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


def collectives(hlo: str) -> dict[str, dict]:
  """{kind: {'count': executions per step, 'bytes': per-device result bytes per step, 'ops': static count}}."""
  comps, entry = _computations(hlo)
  runs = collections.Counter({entry: 1})
  order, seen = [entry], {entry}
  while order:  # computations called from `name` run runs[name] x (trip count) times
    name = order.pop(0)
    for line in comps.get(name, []):
      trip = int(_TRIP.search(line).group(1)) if " while(" in line and _TRIP.search(line) else 1
      callees = _CALLEE.findall(line) + [c.strip().lstrip("%") for b in _BRANCHES.findall(line)
                                         for c in b.split(",")]
      for callee in callees:
        runs[callee] += runs[name] * (trip if " while(" in line else 1)
        if callee not in seen:
          seen.add(callee)
          order.append(callee)
  out = {kind: {"count": 0, "bytes": 0, "ops": 0} for kind in COLLECTIVES}
  for name, lines in comps.items():
    for line in lines:
      m = _INSTRUCTION.match(line)
      if m and runs[name]:
        kind = m.group(2)
        out[kind]["ops"] += 1
        out[kind]["count"] += runs[name]
        out[kind]["bytes"] += runs[name] * shape_bytes(m.group(1))
  return out


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
  import jax

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

"""Where a compiled TPU program's estimated time goes: a roofline per scheduled HLO instruction, by kind.

`cost_analysis()` gives one total, `optimal_seconds`, the compiler's roofline estimate (a lower bound on time). To
split it, this module reads the compiled program's text: for each instruction of the entry computation (a fusion
counts as one, as the compiler schedules it) it takes the FLOPs of the convolutions inside it, or the cost a Mosaic
/ Pallas custom call declares (`ragged_dot`, megablox), and the bytes of its operands and result, and charges
max(FLOPs / peak, bytes / bandwidth). Peak and bandwidth are the compiler's own: one bf16 matmul and one add
compiled for the same device give them (`compiler_roofline`). The sum tracks `optimal_seconds` to a few per cent;
callers print both. Collectives are charged like any other instruction (by their bytes at HBM bandwidth, as the
compiler's estimate does): neither models the ICI links.

Kinds: 'collectives' by opcode; then by the source of the instruction's innermost frame in the metadata (a
fusion's is its root's), 'dispatch' (`gshard_mt/moe/dispatch.py` and `Routing`'s dense [G, S, E, C] tensors: one-hot
einsums, gathers, scatters) and 'gating' (the rest of `gating.py`: softmax, top-2, the position cumsums); then
'matmul' (anything with FLOPs: the experts, the dense FFN, the router); then 'dispatch' for the gathers, scatters
and sorts the compiler adds; the rest is 'elementwise' (activations, casts, layout copies, reductions).
"""

from __future__ import annotations

import collections
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np

from gshard_mt.tpu.estimates import hlo
from gshard_mt.tpu.estimates import tpu_compiler as tpu

KINDS = ("matmul", "dispatch", "gating", "elementwise", "collectives")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")
_OPCODE = re.compile(r"([\w\-]+)\(")
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "copy-start", "copy-done", "after-all",
         "partition-id", "replica-id"}
_MOVES = ("gather", "scatter", "sort", "dynamic-slice", "dynamic-update-slice")


def compiler_roofline(device) -> tuple[float, float]:
  """(FLOP/s, bytes/s) that the TPU compiler's cost model assumes for `device`: a bf16 matmul's FLOPs and an
  f32 add's bytes over their `optimal_seconds`. The matmul is large: the estimate of a 4096^3 one on v5p is 14%
  over its FLOPs at peak, that of an 8192^3 one exactly at peak (394 TFLOP/s)."""
  return _compiler_roofline(device)


@functools.cache
def _compiler_roofline(device) -> tuple[float, float]:
  sharding = jax.sharding.SingleDeviceSharding(device)
  a = jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16, sharding=sharding)
  b = jax.ShapeDtypeStruct((4096, 4096), jnp.float32, sharding=sharding)
  matmul = tpu.compiler_cost(jax.jit(jnp.matmul).lower(a, a).compile())
  add = tpu.compiler_cost(jax.jit(jnp.add).lower(b, b).compile())
  return matmul["flops"] / matmul["optimal_seconds"], add["bytes accessed"] / add["optimal_seconds"]


def _split(rest: str) -> tuple[str, str, str, str]:
  """'TYPE opcode(operands), attributes' -> (TYPE, opcode, operands, attributes); TYPE may be a tuple."""
  if rest.startswith("("):
    end = _closing(rest, 0)
    result, rest = rest[: end + 1], rest[end + 1:].lstrip()
  else:
    result, _, rest = rest.partition(" ")
  m = _OPCODE.match(rest)
  if not m:
    return result, rest, "", ""
  end = _closing(rest, m.end() - 1)
  return result, m.group(1), rest[m.end(): end], rest[end + 1:]


def _closing(text: str, start: int) -> int:
  depth = 0
  for i in range(start, len(text)):
    depth += (text[i] == "(") - (text[i] == ")")
    if depth == 0:
      return i
  return len(text) - 1


def _dims(result: str) -> list[int]:
  m = re.match(r"\w+\[([\d,]*)\]", result)
  return [int(d) for d in m.group(1).split(",") if d] if m else []


def _taps(n: int, size: int, stride: int, low: int, high: int, lhs_dilation: int, rhs_dilation: int) -> int:
  """(output position, window position) pairs of one spatial dimension that land on a real input element (not
  padding, not a dilation hole): batch dimensions written as windows count once per output."""
  span = (n - 1) * lhs_dilation + 1
  out = (span + low + high - ((size - 1) * rhs_dilation + 1)) // stride + 1
  p = np.arange(out)[:, None] * stride + np.arange(size)[None, :] * rhs_dilation - low
  return int(np.sum((p >= 0) & (p < span) & (p % lhs_dilation == 0)))


def convolution_flops(result: str, lhs: str, rhs: str, attributes: str) -> int:
  """2 x multiply-adds of an HLO convolution (the TPU compiler writes every dot as one)."""
  labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", attributes).groups()
  window = re.search(r"window=\{([^}]*)\}", attributes)
  fields = dict(kv.split("=") for kv in window.group(1).split()) if window else {}
  spatial = sum(c.isdigit() for c in labels[1])

  def field(key, default):
    return fields[key].split("x") if key in fields else [default] * spatial

  size, stride = field("size", "1"), field("stride", "1")
  pad, lhs_dilate, rhs_dilate = field("pad", "0_0"), field("lhs_dilate", "1"), field("rhs_dilate", "1")
  lhs_dims, rhs_dims, out_dims = _dims(lhs), _dims(rhs), _dims(result)
  taps = 1
  for d in range(spatial):
    low, high = (int(x) for x in pad[d].split("_"))
    taps *= _taps(lhs_dims[labels[0].index(str(d))], int(size[d]), int(stride[d]), low, high, int(lhs_dilate[d]),
                  int(rhs_dilate[d]))
  batch, features = out_dims[labels[2].index("b")], out_dims[labels[2].index("f")]
  return 2 * batch * features * rhs_dims[labels[1].index("i")] * taps


def _frames(text: str) -> dict[int, tuple[str, str]]:
  """{stack frame id: (source file, function) of that frame}, from the tables at the head of the program text."""
  tables = collections.defaultdict(dict)
  table = None
  for line in text.split("\n\n%", 1)[0].splitlines():
    if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      table = line
    elif table and (m := re.match(r"(\d+) (.*)", line)):
      tables[table][int(m.group(1))] = m.group(2)
  files = {i: v.strip('"') for i, v in tables["FileNames"].items()}
  functions = {i: v.strip('"') for i, v in tables["FunctionNames"].items()}
  locations = {i: (files.get(int(re.search(r"file_name_id=(\d+)", v).group(1)), ""),
                   functions.get(int(re.search(r"function_name_id=(\d+)", v).group(1)), ""))
               for i, v in tables["FileLocations"].items()}
  return {i: locations.get(int(re.search(r"file_location_id=(\d+)", v).group(1)), ("", ""))
          for i, v in tables["StackFrames"].items()}


def _kind(opcode: str, line: str, flops: float, source: tuple[str, str]) -> str:
  file, function = source
  if any(opcode.startswith(c) for c in hlo.COLLECTIVES):
    return "collectives"
  if file.endswith("moe/dispatch.py") or file.endswith("moe/gating.py") and function.startswith("Routing."):
    return "dispatch"  # Routing builds the einsum dispatcher's [G, S, E, C] tensors
  if file.endswith("moe/gating.py"):
    return "gating"
  if flops:
    return "matmul"
  if opcode in _MOVES or re.search(r"gather|scatter|sort", line.split(" = ", 1)[0] + opcode):
    return "dispatch"
  return "elementwise"


def instruction_costs(text: str, flops_per_s: float, bytes_per_s: float) -> list[dict]:
  """Per scheduled instruction of the compiled program `text`: name, opcode, result (its type), source ((file,
  function) of its innermost frame), op_name (the JAX operation), kind, flops, bytes, seconds.

  Loops and calls are followed into their bodies once (as cost_analysis counts them); an asynchronous operation
  (start / update / done) is charged at its 'done': its result read once and written once."""
  comps, entry = hlo._computations(text)
  frames = _frames(text)
  parsed = {}
  for name, lines in comps.items():
    parsed[name] = []
    for line in lines:
      if m := _INSTRUCTION.match(line):
        parsed[name].append((m.group(1), *_split(m.group(2)), line))
  rows = []

  def visit(name):
    types = {n: result for n, result, *_ in parsed[name]}
    for instr, result, opcode, operands, attributes, line in parsed[name]:
      if opcode in ("while", "call", "conditional"):
        for callee in re.findall(r"(?:body|to_apply|branch_computations=\{)%?([\w.\-]+)", attributes):
          if callee in parsed:
            visit(callee)
        continue
      if opcode in _FREE or opcode.endswith("-start") or opcode.endswith("-update"):
        continue
      flops = 0
      if declared := hlo.DECLARED.search(line):
        flops, nbytes = int(declared["flops"]), int(declared["bytes"])
      elif opcode.endswith("-done"):
        nbytes = 2 * hlo.shape_bytes(result)
      else:
        args = re.findall(r"%([\w.\-]+)", operands)
        nbytes = hlo.shape_bytes(result) + sum(hlo.shape_bytes(types[a]) for a in args if a in types)
        if opcode == "convolution":
          flops = convolution_flops(result, types[args[0]], types[args[1]], attributes)
        elif opcode == "fusion" and (callee := re.search(r"calls=%?([\w.\-]+)", attributes)):
          inner = {n: r for n, r, *_ in parsed[callee.group(1)]}
          flops = sum(convolution_flops(r, inner[_args(o)[0]], inner[_args(o)[1]], a)
                      for _, r, op, o, a, _ in parsed[callee.group(1)] if op == "convolution")
      frame, op_name = re.search(r"stack_frame_id=(\d+)", line), re.search(r'op_name="([^"]*)"', line)
      source = frames.get(int(frame.group(1)), ("", "")) if frame else ("", "")
      rows.append(dict(name=instr, opcode=opcode, result=result, source=source,
                       op_name=op_name.group(1) if op_name else "", kind=_kind(opcode, line, flops, source),
                       flops=flops, bytes=nbytes, seconds=max(flops / flops_per_s, nbytes / bytes_per_s)))

  visit(entry)
  return rows


def _args(operands: str) -> list[str]:
  return re.findall(r"%([\w.\-]+)", operands)


def breakdown(text: str, flops_per_s: float, bytes_per_s: float) -> dict[str, float]:
  """{kind: estimated seconds} over KINDS for the compiled program `text`."""
  out = dict.fromkeys(KINDS, 0.0)
  for row in instruction_costs(text, flops_per_s, bytes_per_s):
    out[row["kind"]] += row["seconds"]
  return out


def estimate_and_attributed(compiled, device) -> tuple[float, float]:
  """(the compiler's `optimal_seconds` for a program compiled for `device`, the part of it the per-instruction
  roofline attributes): their difference is what the compiler charges beyond FLOPs and bytes."""
  flops_per_s, bytes_per_s = compiler_roofline(device)
  return (tpu.compiler_cost(compiled)["optimal_seconds"],
          sum(breakdown(compiled.as_text(), flops_per_s, bytes_per_s).values()))

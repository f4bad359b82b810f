"""The TPU compiler's own estimate of each fusion of a compiled program: each fused computation compiled alone.

`optimal_seconds` is one total for the program. `roofline.instruction_costs` charges each instruction its FLOPs and
its operands' and result's bytes, and the sum falls short of the total (docs/decisions.md: by the bytes that the
compiler counts beyond those). Here the compiler is asked itself, one fusion at a time: the fused computation
becomes the entry computation of a module of its own, which the same compile-only client compiles.

Three rewrites make such a module compile as the program's fusion did:
- The compiler computes bf16 arithmetic in float32 and marks each such instruction with its original type
  (`float_type_correction_info`); parsed back without that mark, the float32 operation is charged as float32 work
  (5x for a bf16 multiply-reduce). It becomes the bf16 operation again, between converts, and is normalised anew.
- A fusion inside a fusion becomes a call.
- A bitcast becomes a reshape (a bitcast between layouts does not parse back).

A fusion compiled alone gets layouts and memory spaces of its own choosing, so its cost is an estimate of an
estimate: for matmul fusions it can differ from their share of the program's total in either direction.
"""

from __future__ import annotations

import re

import jax
from jax._src.interpreters import mlir
from jax._src.lib import _jax, xla_client
from jax._src.lib.mlir import ir
from jaxlib import _hlo

from gshard_mt.tpu.estimates import hlo
from gshard_mt.tpu.estimates import tpu_compiler as tpu

_HEADER = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \(")
_FUSION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = .* fusion\(.*calls=%?([\w.\-]+)")
_INSTRUCTION = re.compile(r"^(\s*(?:ROOT )?)%([\w.\-]+) = f32\[([\d,]*)\](\{[^}]*\})? ([\w\-]+)\((.*?)\)(.*)$")
_BF16_IN_F32 = '"float_type_correction_info":{"original_type":"BF16"'


def _blocks(text: str) -> dict[str, str]:
  """{computation name: its text}, in the program's order (callees before callers)."""
  blocks = {}
  for block in re.split(r"\n(?=%[\w.\-]+ \(|ENTRY )", text):
    if m := _HEADER.match(block):
      blocks[m.group(1)] = block[: block.index("\n}") + 2]
  return blocks


def _rewrite(block: str) -> str:
  lines = []
  for line in block.splitlines():
    m = _INSTRUCTION.match(line)
    if m and _BF16_IN_F32 in line:
      head, name, dims, layout, opcode, operands, rest = m.groups()
      inputs = []
      for i, operand in enumerate(operands.split(", ")):
        lines.append(f"  %{name}.in{i} = bf16[{dims}] convert({operand})")
        inputs.append(f"%{name}.in{i}")
      rest = re.sub(r", backend_config=.*", "", rest)
      lines.append(f"  %{name}.bf16 = bf16[{dims}] {opcode}({', '.join(inputs)}){rest}")
      lines.append(f"{head}%{name} = f32[{dims}]{layout or ''} convert(%{name}.bf16)")
      continue
    line = line.replace(" bitcast(", " reshape(", 1)
    if " fusion(" in line:
      line = re.sub(r", kind=k\w+", "", line.replace(" fusion(", " call(", 1)).replace("calls=", "to_apply=")
    lines.append(line)
  return "\n".join(lines)


def fusion_modules(text: str) -> dict[str, str]:
  """{name of a fusion of the entry computation: an HLO module whose entry computation is that fusion's} for the
  compiled program `text`."""
  blocks = _blocks(text)
  entry = next(name for name, block in blocks.items() if block.startswith("ENTRY"))

  def callees(name, seen):
    for callee in (c for line in blocks[name].splitlines() for c in hlo._callees(line)):
      if callee in blocks and callee not in seen:
        seen.add(callee)
        callees(callee, seen)
    return seen

  modules = {}
  for line in blocks[entry].splitlines():
    if m := _FUSION.match(line):
      name, fused = m.groups()
      called = callees(fused, set())
      parts = [_rewrite(block) for callee, block in blocks.items() if callee in called]
      parts.append(_rewrite("ENTRY " + blocks[fused]))
      modules[name] = "HloModule " + name + "\n\n" + "\n\n".join(parts) + "\n"
  return modules


def module_seconds(module: str, device) -> float:
  """The compiler's `optimal_seconds` for the HLO module text `module`, compiled for the compile-only `device`."""
  with mlir.make_ir_context():
    proto = _hlo.hlo_module_from_text(module).as_serialized_hlo_module_proto()
    stablehlo = ir.Module.parse(_jax.mlir.hlo_to_stablehlo(proto))
    compiled = device.client.compile(stablehlo, executable_devices=xla_client.DeviceList((device,)),
                                     compile_options=xla_client.CompileOptions())
  return tpu.compiler_cost(compiled)["optimal_seconds"]


def fusion_seconds(text: str, device) -> dict[str, float | None]:
  """{fusion name: the compiler's estimate of it alone, or None where its module does not compile} for the
  compiled program `text` (a few fusions use operations that do not convert back, such as the threefry
  generator's)."""
  out = {}
  for name, module in fusion_modules(text).items():
    try:
      out[name] = module_seconds(module, device)
    except (jax.errors.JaxRuntimeError, ir.MLIRError):
      out[name] = None
  return out

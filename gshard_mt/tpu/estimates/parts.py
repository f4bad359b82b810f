"""The parts of a training step that time is summed by: one table for the TPU compiler's estimate
(bench/step_breakdown.py) and the profile measured on an accelerator (bench/profile_step.py), so that both split a
step the same way.

An instruction's part comes from its metadata in the compiled program: the JAX operation (`op_name`, the module
path such as `.../units/layer_0/ffn/Dropout_0/...`), the (file, function) of its innermost stack frame, and its
opcode.
"""

from __future__ import annotations

import functools
import re

from gshard_mt.tpu.estimates import hlo, roofline

# (part, test on ('file.py:function' of the innermost frame, HLO op_name, opcode)), first match wins. Dropout (its
# random bits included) comes before attention and the dense FFN, which hold dropouts of their own.
PARTS = (
    ("collectives", lambda f, op, code: code.startswith(("all-", "reduce-scatter", "collective-"))),
    # The logits' matmul and its transposes (weight_einsum's backward: 'BLV,MV->BLM', 'BLM,BLV->MV').
    ("logits and cross-entropy", lambda f, op, code: re.search(r"decode_logits/[A-Z,>\-]*MV\b", op) is not None
     or f == "step.py:cross_entropy" or f.startswith(("loss.py:", "logit_stats.py:"))),
    # No JAX operation: what XLA adds itself (a loop's buffers and their set-up, layout copies).
    ("XLA's own: loop buffers, copies", lambda f, op, code: not op and not f.strip(":")),
    ("optimizer, gradient norm, finite check", lambda f, op, code: "Transformer" not in op
     or f.split(":")[0] in ("numerics.py", "_clipping.py", "_tree_math.py", "factorized.py")),
    # The capacity paths' einsums with the expert weights (EMH, EHM) and their transposes, their Pallas kernels
    # (moe.expert_kernel, the layer's only Pallas calls), and the grouped dispatch's matmuls (their frames in
    # moe/grouped.py: XLA's ragged_dot in its lambdas, the Mosaic GPU kernels, named only 'body', in by_weights
    # and by_rows).
    ("MoE expert matmuls", lambda f, op, code: "/moe/" in op and (
        "EMH" in op or "EHM" in op or op.endswith("/pallas_call")
        or f in ("grouped.py:<lambda>", "grouped.py:by_weights", "grouped.py:by_rows"))),
    ("MoE router, gating, dispatch, combine", lambda f, op, code: "/moe/" in op),
    ("dropout", lambda f, op, code: "Dropout" in op or "/dropout/" in op),
    # The layer norm before attention is applied inside the Attention module (layers.norm_terms, normalize).
    ("attention", lambda f, op, code: "attention" in op and not f.startswith("layers.py:norm")),
    ("dense FFN", lambda f, op, code: "/ffn/" in op),
    ("layer norms, residuals, embeddings, rest", lambda f, op, code: True),
)
# Library matmuls that a custom call names: cuBLAS / cuBLASLt, CUTLASS, grouped matmuls (ragged_dot, megablox,
# and the Mosaic GPU kernels, the only Mosaic GPU calls of a step).
_MATMUL_CALL = re.compile(r'custom_call_target="[^"]*(?:gemm|matmul|cublas|cutlass|ragged|gmm|mosaic_gpu)',
                          re.IGNORECASE)
_CALLS = re.compile(r"calls=%?([\w.\-]+)")


def part_of(source: tuple[str, str], op_name: str, opcode: str) -> str:
  """The part of PARTS that an instruction belongs to; `source` is (file path, function) of its frame."""
  where = f"{source[0].rsplit('/', 1)[-1]}:{source[1]}"
  return next(name for name, test in PARTS if test(where, op_name, opcode))


def instructions(text: str) -> dict[str, dict]:
  """{name: {opcode, op_name, source, part, matmul}} for every instruction of the compiled program `text`, in every
  computation (a profile names the instructions of loop bodies as they run). `matmul`: a dot or convolution, a
  library matmul's custom call, or a fusion around one."""
  comps, _ = hlo._computations(text)
  frames = roofline._frames(text)
  parsed = {name: [(m.group(1), roofline._split(m.group(2))[1], line) for line in lines
                   if (m := roofline._INSTRUCTION.match(line))] for name, lines in comps.items()}
  direct = {name: any(_is_matmul(opcode, line) for _, opcode, line in rows) for name, rows in parsed.items()}

  @functools.cache
  def holds_matmul(comp: str) -> bool:  # a fusion's computation, or a fusion's inside it (HLO calls form no cycle)
    return direct.get(comp, False) or any(holds_matmul(callee) for _, opcode, line in parsed.get(comp, ())
                                          if opcode == "fusion" for callee in _CALLS.findall(line))

  out = {}
  for rows in parsed.values():
    for name, opcode, line in rows:
      frame, op_name = re.search(r"stack_frame_id=(\d+)", line), re.search(r'op_name="([^"]*)"', line)
      source = frames.get(int(frame.group(1)), ("", "")) if frame else ("", "")
      op_name = op_name.group(1) if op_name else ""
      callee = _CALLS.search(line) if opcode == "fusion" else None
      out[name] = dict(opcode=opcode, op_name=op_name, source=source, part=part_of(source, op_name, opcode),
                       matmul=_is_matmul(opcode, line) or bool(callee and holds_matmul(callee.group(1))))
  return out


def _is_matmul(opcode: str, line: str) -> bool:
  return opcode in ("dot", "convolution") or opcode == "custom-call" and bool(_MATMUL_CALL.search(line))

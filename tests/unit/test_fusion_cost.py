"""Each fusion of a compiled program as a module of its own (gshard_mt.tpu.estimates.fusion_cost)."""

import sys

import pytest

from gshard_mt.tpu.estimates import fusion_cost

# The shape of a compiled TPU program: a float-normalised bf16 multiply (float32, marked with its original type),
# a fusion inside the fusion, a bitcast between layouts, and a reducer that the fused computation calls.
PROGRAM = """HloModule jit_f, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[]{:T(128)} parameter(0)
  %b = f32[]{:T(128)} parameter(1)
  ROOT %s = f32[]{:T(128)} add(%a, %b)
}

%inner (p: f32[8,128]) -> f32[8,128] {
  %p = f32[8,128]{1,0:T(8,128)} parameter(0)
  ROOT %n = f32[8,128]{1,0:T(8,128)} negate(%p)
}

%fused (param_0: bf16[8,128], param_1: bf16[8,128]) -> f32[8] {
  %param_0 = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(0)
  %param_1 = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(1)
  %c0 = f32[8,128]{1,0:T(8,128)} convert(%param_0)
  %c1 = f32[8,128]{1,0:T(8,128)} convert(%param_1)
  %m = f32[8,128]{1,0} multiply(%c0, %c1), backend_config={"float_type_correction_info":{"original_type":"BF16"}}
  %f = f32[8,128]{1,0:T(8,128)} fusion(%m), kind=kLoop, calls=%inner
  %t = f32[8,128]{0,1:T(8,128)} bitcast(%f)
  %z = f32[]{:T(128)} constant(0)
  ROOT %r = f32[8]{0:T(128)} reduce(%t, %z), dimensions={1}, to_apply=%add
}

ENTRY %main (x: bf16[8,128], y: bf16[8,128]) -> f32[8] {
  %x = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(0)
  %y = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(1)
  ROOT %multiply_reduce_fusion = f32[8]{0:T(128)} fusion(%x, %y), kind=kLoop, calls=%fused
}
"""


def test_a_fusion_becomes_a_module_that_parses_with_its_rewrites():
  from jaxlib import _hlo

  modules = fusion_cost.fusion_modules(PROGRAM)
  assert list(modules) == ["multiply_reduce_fusion"]
  module = modules["multiply_reduce_fusion"]
  assert "ENTRY %fused (" in module and "%add (" in module and "%inner (" in module and "%main" not in module
  assert "%m.bf16 = bf16[8,128] multiply(%m.in0, %m.in1)" in module  # bf16 again, between converts
  assert "float_type_correction_info" not in module
  assert " fusion(" not in module and "call(%m), to_apply=%inner" in module
  assert " bitcast(" not in module and "reshape(%f)" in module
  _hlo.hlo_module_from_text(module)  # raises on a module that does not parse


def test_a_one_fusion_program_costs_alone_what_it_costs_in_the_program():
  if sys.platform != "linux":
    pytest.skip("libtpu (the TPU compiler) has wheels for Linux only")
  import jax
  import jax.numpy as jnp
  import libtpu  # noqa: F401 - .[test] installs it on Linux: a missing or broken one fails, never skips

  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  device, sharding = tpu.one_chip("v5p:1x1x1")
  dy = jax.ShapeDtypeStruct((2, 256, 512), jnp.bfloat16, sharding=sharding)
  x = jax.ShapeDtypeStruct((2, 2, 256, 512), jnp.bfloat16, sharding=sharding)
  # The combine's weight gradient: a bf16 multiply that the compiler computes in float32, reduced over M.
  compiled = jax.jit(lambda dy, x: jnp.einsum("GSM,KGSM->KGS", dy, x)).lower(dy, x).compile()
  text = compiled.as_text()
  assert "float_type_correction_info" in text
  (seconds,) = fusion_cost.fusion_seconds(text, device).values()
  assert seconds == pytest.approx(tpu.compiler_cost(compiled)["optimal_seconds"], rel=0.05)

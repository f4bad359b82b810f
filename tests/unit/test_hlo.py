"""Reading a compiled program: collectives counted per execution (loops multiply, in the CPU's and the TPU's loop
forms), their bytes, costs with loop bodies counted, the program's size, whole-weight all-gathers, per-device
memory and parameter bytes."""

import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.tpu.estimates import hlo

HLO = """\
%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %a = f32[8,4]{1,0} all-to-all(%x), dimensions={0}
  ROOT %t = (s32[], f32[4]) tuple(%i, %a)
}

%cond (p: (s32[], f32[4])) -> pred[] {
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (p0: f32[4], /*index=1*/p1: bf16[2,3]) -> f32[4] {
  %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"9"}}
  %r = bf16[2,3]{1,0} all-reduce(%p1), to_apply=%add
  ROOT %g = (f32[4]{0}, f32[4]{0}) all-gather(%p0, %p0), dimensions={0}
}
"""


def test_collectives_count_loop_iterations():
  c = hlo.collectives(HLO)
  assert c["all-to-all"] == {"count": 9, "bytes": 9 * 8 * 4 * 4, "ops": 1}
  assert c["all-reduce"] == {"count": 1, "bytes": 12, "ops": 1}
  assert c["all-gather"] == {"count": 1, "bytes": 32, "ops": 1}
  assert hlo.shape_bytes("(f32[2,2]{1,0}, bf16[3])") == 22


NESTED = """\
%inner (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %a = f32[2,4]{1,0} all-to-all(%x), dimensions={0}
  ROOT %t = (s32[], f32[4]) tuple(%i, %a)
}

%outer (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %w = (s32[], f32[4]) while(%init), condition=%c, body=%inner, backend_config={"known_trip_count":{"n":"5"}}
  %p = f32[4]{0} collective-permute(%x), source_target_pairs={{0,1}}
  ROOT %t = (s32[], f32[4]) tuple(%i, %p)
}

%left (p: f32[4]) -> f32[4] {
  ROOT %r = f32[4]{0} all-reduce(%p), to_apply=%add
}

%right (p: f32[4]) -> f32[4] {
  ROOT %n = f32[4]{0} negate(%p)
}

ENTRY %main (p0: f32[4]) -> f32[4] {
  %w = (s32[], f32[4]) while(%init), condition=%c, body=%outer, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %b = f32[4]{0} conditional(%k, %p0, %p0), branch_computations={%left, %right}
}
"""


def test_nested_loops_multiply_and_branches_count_once():
  c = hlo.collectives(NESTED)
  assert c["all-to-all"] == {"count": 3 * 5, "bytes": 3 * 5 * 2 * 4 * 4, "ops": 1}
  assert c["collective-permute"] == {"count": 3, "bytes": 3 * 16, "ops": 1}
  assert c["all-reduce"] == {"count": 1, "bytes": 16, "ops": 1}  # a branch: counted as if taken
  assert c["all-gather"] == c["reduce-scatter"] == {"count": 0, "bytes": 0, "ops": 0}


def test_instruction_count_and_whole_weight_gathers():
  assert hlo.instruction_count(HLO) == 6  # %a, %t, %lt, %w, %r, %g
  assert hlo.gathers_of(HLO, [(4,)]) == 2  # both results of the tuple all-gather end in [4]
  assert hlo.gathers_of(HLO, [(8, 4)]) == 0  # the [8, 4] result is an all-to-all's


def test_memory_of_a_compiled_program():
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  plain = hlo.memory(jax.jit(lambda x: x * 2).lower(x).compile())
  assert (plain["argument"], plain["output"], plain["alias"]) == (1024, 1024, 0)
  assert plain["peak"] == 2048 + plain["temp"]
  donated = hlo.memory(jax.jit(lambda x: x * 2, donate_argnums=0).lower(x).compile())
  assert donated["alias"] == 1024 and donated["peak"] == 1024 + donated["temp"]


def test_per_device_bytes_counts_one_shard_of_each_leaf():
  quarter = types.SimpleNamespace(shard_shape=lambda shape: (shape[0] // 4, *shape[1:]))
  whole = types.SimpleNamespace(shard_shape=lambda shape: shape)
  tree = {"w": jax.ShapeDtypeStruct((8, 16), jnp.float32), "b": jax.ShapeDtypeStruct((16,), jnp.bfloat16)}
  assert hlo.per_device_bytes(tree, {"w": quarter, "b": whole}) == 2 * 16 * 4 + 16 * 2
  assert hlo.per_device_bytes(tree, {"w": whole, "b": whole}) == int(np.prod((8, 16))) * 4 + 16 * 2


# The TPU compiler's loop form: no known_trip_count; the condition reads `i < 6` and i starts at 2 (a constant
# passed through a copy), so the body runs 4 times. A second loop's bound is not a constant: unreadable.
TPU_LOOP = """\
%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %a = f32[8,4]{1,0:T(8,128)} all-to-all(%x), dimensions={0}, metadata={op_name="jit(f)/units/moe/all_to_all"}
  %b = f32[8,4]{1,0:T(8,128)} all-to-all(%x), dimensions={0}, metadata={op_name="concatenate.3"}
  ROOT %t = (s32[], f32[4]) tuple(%i, %a)
}

%cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[]{:T(256)}, f32[4]{0}) parameter(0)
  %n = s32[]{:T(256)} constant(6)
  %i = s32[]{:T(256)} get-tuple-element(%p), index=0
  ROOT %lt = pred[]{:T(1024)} compare(%i, %n), direction=LT, metadata={op_name="jit(f)/while/cond/lt"}
}

%cond2 (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, %i), direction=LT
}

ENTRY %main (p0: f32[4]) -> f32[4] {
  %two = s32[]{:T(256)} constant(2)
  %start = s32[]{:T(256)} copy(%two)
  %init = (s32[]{:T(256)}, f32[4]{0}) tuple(%start, %p0)
  %w = (s32[]{:T(256)}, f32[4]{0}) while(%init), condition=%cond, body=%body
  %w2 = (s32[]{:T(256)}, f32[4]{0}) while(%init), condition=%cond2, body=%body2
  ROOT %r = f32[4]{0} get-tuple-element(%w), index=1
}
"""


def test_trip_counts_of_the_tpu_loop_form():
  assert hlo.loops(TPU_LOOP) == {"body": 4, "body2": None}
  c = hlo.collectives(TPU_LOOP)
  assert c["all-to-all"] == {"count": 8, "bytes": 8 * 8 * 4 * 4, "ops": 2}
  assert hlo.collectives(TPU_LOOP, op_name="/moe/")["all-to-all"] == {"count": 4, "bytes": 4 * 8 * 4 * 4, "ops": 1}


def _scan_and_loop(n):
  def scanned(x, ws):
    return jax.lax.scan(lambda x, w: (jnp.tanh(x @ w), None), x, ws)[0]

  def unrolled(x, ws):
    for i in range(n):
      x = jnp.tanh(x @ ws[i])
    return x

  x, ws = jax.ShapeDtypeStruct((64, 64), jnp.float32), jax.ShapeDtypeStruct((n, 64, 64), jnp.float32)
  return [jax.jit(f).lower(x, ws).compile() for f in (scanned, unrolled)]


def test_costs_count_each_loop_body_as_often_as_it_runs():
  """XLA's cost analysis counts the scan's body once; `costs` counts it 5 times, like the unrolled loop's, also
  when the trip count has to be read from the loop's condition (as in a TPU program)."""
  scanned, unrolled = _scan_and_loop(5)
  text = scanned.as_text()
  matmul = 2 * 64**3
  assert scanned.cost_analysis()["flops"] < 1.1 * matmul  # the body once
  costs = hlo.costs(text)
  assert costs["flops"] == pytest.approx(5 * matmul, rel=1e-4)
  assert costs["flops"] == pytest.approx(unrolled.cost_analysis()["flops"], rel=1e-4)
  assert costs["transcendentals"] == 5 * 64 * 64  # tanh
  without = re.sub(r'"known_trip_count":\{"n":"\d+"\},?', "", text)
  assert "known_trip_count" not in without
  assert list(hlo.loops(without).values()) == list(hlo.loops(text).values()) == [5]
  assert hlo.costs(without) == costs


def test_costs_count_the_flops_a_pallas_kernel_declares():
  """XLA's analysis counts no FLOPs in a custom call; `costs` adds what a Mosaic kernel declares (here the loss's
  one-pass reductions, compiled for a v5p), as the TPU compiler's own count does."""
  import jax
  import jax.numpy as jnp

  from gshard_mt.kernels import logit_stats
  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  sharding = jax.sharding.SingleDeviceSharding(tpu.topology_devices("v5p:1x1x1")[0])
  z = jax.ShapeDtypeStruct((64, 1024), jnp.bfloat16, sharding=sharding)
  t = jax.ShapeDtypeStruct((64, 1), jnp.int32, sharding=sharding)
  program = jax.jit(lambda z, t: logit_stats.kernel(z, t, interpret=False)).lower(z, t).compile()
  declared = [int(m["flops"]) for m in hlo.DECLARED.finditer(program.as_text())]
  assert declared == [8 * 64 * 1024]
  # (XLA's analysis counts the custom call itself as -1 FLOP)
  assert hlo.costs(program.as_text())["flops"] == pytest.approx(tpu.compiler_cost(program)["flops"], abs=1)

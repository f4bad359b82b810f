"""The per-instruction roofline of a compiled TPU program: convolution FLOPs (batch dimensions written as windows
included), bytes, kinds, and on a real compiled MoE layer the FLOPs the compiler counts."""

import sys

import pytest

from gshard_mt.tpu.estimates import roofline

# The expert matmul EGCM x EMH -> EGCH as the TPU compiler writes it: E and G as windowed spatial dimensions.
EXPERT_MATMUL = ("bf16[32,16,80,4096]", "bf16[32,16,80,1024]", "bf16[32,1024,4096,1]",
                 "window={size=32x1 stride=31x1 lhs_dilate=32x1}, dim_labels=01bf_0io1->01bf")


def test_convolution_flops():
  assert roofline.convolution_flops("f32[8,32]", "f32[8,16]", "f32[16,32]", "dim_labels=bf_io->bf") == 2 * 8 * 16 * 32
  E, G, C, M, H = 32, 16, 80, 1024, 4096
  assert roofline.convolution_flops(*EXPERT_MATMUL) == 2 * E * G * C * M * H  # each (e, g) pair once
  # A real 3-wide window over a padded input: 8 outputs, 3 taps each minus the 2 that fall on padding.
  assert roofline.convolution_flops("f32[1,8,4]", "f32[1,8,2]", "f32[3,2,4]",
                                    "window={size=3 pad=1_1}, dim_labels=b0f_0io->b0f") == 2 * 4 * 2 * (8 * 3 - 2)


PROGRAM = """HloModule m, is_scheduled=true

FileNames
1 "/x/gshard_mt/moe/dispatch.py"

FunctionNames
1 "IndexDispatcher.dispatch"

FileLocations
1 {file_name_id=1 function_name_id=1 line=1 end_line=1 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}


%fused (p0: bf16[32,16,80,1024], p1: bf16[32,1024,4096,1]) -> bf16[32,16,80,4096] {
  %p0 = bf16[32,16,80,1024]{3,2,1,0} parameter(0)
  %p1 = bf16[32,1024,4096,1]{3,2,1,0} parameter(1)
  ROOT %c = bf16[32,16,80,4096]{3,2,1,0} convolution(%p0, %p1), CONV
}

ENTRY %main (a: bf16[32,16,80,1024], b: bf16[32,1024,4096,1], i: s32[100]) -> bf16[32,16,80,4096] {
  %a = bf16[32,16,80,1024]{3,2,1,0} parameter(0)
  %b = bf16[32,1024,4096,1]{3,2,1,0} parameter(1)
  %i = s32[100]{0} parameter(2)
  %g = bf16[100,1024]{1,0} gather(%a, %i), offset_dims={1}, metadata={op_name="x" stack_frame_id=1}
  %t = (bf16[100,1024]{1,0}, bf16[100,1024]{1,0}) all-to-all(%g, %g), dimensions={0}
  %k = f32[100]{0} custom-call(%i), custom_call_target="tpu_custom_call", backend_config={COST}
  %y = bf16[100,1024]{1,0} copy(%g)
  ROOT %f = bf16[32,16,80,4096]{3,2,1,0} fusion(%a, %b), kind=kOutput, calls=%fused
}
""".replace("CONV", EXPERT_MATMUL[3]).replace(
    "COST", '"custom_call_config":{"cost_estimate":{"flops":"1000","transcendentals":"0","bytes_accessed":"2000"}}')


def test_instruction_costs_and_kinds():
  rows = {r["name"]: r for r in roofline.instruction_costs(PROGRAM, flops_per_s=1e12, bytes_per_s=1e9)}
  assert set(rows) == {"g", "t", "k", "y", "f"}  # parameters cost nothing
  kinds = {name: r["kind"] for name, r in rows.items()}
  assert kinds == {"g": "dispatch", "t": "collectives", "k": "matmul", "y": "elementwise", "f": "matmul"}
  g = rows["g"]  # where it comes from, for callers that split by part (bench/step_breakdown.py)
  assert g["result"] == "bf16[100,1024]{1,0}" and g["op_name"] == "x"
  assert g["source"] == ("/x/gshard_mt/moe/dispatch.py", "IndexDispatcher.dispatch")
  assert rows["t"]["result"].startswith("(bf16[100,1024]") and rows["t"]["op_name"] == ""
  assert rows["k"]["flops"] == 1000 and rows["k"]["bytes"] == 2000  # the kernel's declared cost
  assert rows["y"]["bytes"] == 2 * 100 * 1024 * 2 and rows["y"]["seconds"] == rows["y"]["bytes"] / 1e9
  f = rows["f"]
  assert f["flops"] == roofline.convolution_flops(*EXPERT_MATMUL)
  assert f["bytes"] == 2 * (32 * 16 * 80 * 1024 + 32 * 1024 * 4096 + 32 * 16 * 80 * 4096)
  assert f["seconds"] == max(f["flops"] / 1e12, f["bytes"] / 1e9)
  total = roofline.breakdown(PROGRAM, 1e12, 1e9)
  assert set(total) == set(roofline.KINDS)
  assert total["matmul"] == pytest.approx(rows["k"]["seconds"] + f["seconds"])


def test_a_compiled_moe_layer_flops_match_the_compiler():
  if sys.platform != "linux":
    pytest.skip("libtpu (the TPU compiler) has wheels for Linux only")
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import libtpu  # noqa: F401 - .[test] installs it on Linux: a missing or broken one fails, never skips

  from gshard_mt.config.moe import MoeConfig
  from gshard_mt.moe.layer import MoeFeedForward
  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  device = tpu.topology_devices("v5p:1x1x1")[0]
  layer = MoeFeedForward(MoeConfig(num_experts=4, hidden_dim=256, group_size=64, dispatch="index",
                                   second_expert_policy="all"), dtype=jnp.bfloat16)
  sharding = jax.sharding.SingleDeviceSharding(device)
  x = jax.ShapeDtypeStruct((2, 64, 128), jnp.bfloat16, sharding=sharding)
  params = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=sharding),
                        nn.unbox(jax.eval_shape(lambda: layer.init(jax.random.key(0), jnp.zeros(x.shape, x.dtype)))))
  loss = lambda p, x: jnp.sum(layer.apply(p, x)[0].astype(jnp.float32))  # noqa: E731
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
  flops_per_s, bytes_per_s = roofline.compiler_roofline(device)
  assert flops_per_s == pytest.approx(394e12, rel=0.01)  # v5p as the compiler models it (GUIDE 6b)
  rows = roofline.instruction_costs(compiled.as_text(), flops_per_s, bytes_per_s)
  assert sum(r["flops"] for r in rows) == pytest.approx(tpu.compiler_cost(compiled)["flops"], rel=0.02)
  parts = roofline.breakdown(compiled.as_text(), flops_per_s, bytes_per_s)
  assert parts["matmul"] > 0 and parts["dispatch"] > 0 and parts["gating"] > 0 and parts["collectives"] == 0


def test_a_pallas_call_is_charged_its_declared_bytes():
  """What instruction_costs assumes of a custom call: the compiler charges its declared cost, not its operands."""
  if sys.platform != "linux":
    pytest.skip("libtpu (the TPU compiler) has wheels for Linux only")
  import jax
  import jax.numpy as jnp
  import libtpu  # noqa: F401 - .[test] installs it on Linux: a missing or broken one fails, never skips
  from jax.experimental import pallas as pl

  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  device, sharding = tpu.one_chip("v5p:1x1x1")
  x = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=sharding)

  def double(x_ref, o_ref):
    o_ref[...] = 2 * x_ref[...]

  for declared in (1 << 20, 64 << 20):
    call = pl.pallas_call(double, out_shape=x, cost_estimate=pl.CostEstimate(
        flops=0, transcendentals=0, bytes_accessed=declared))
    compiled = jax.jit(call).lower(x).compile()
    assert tpu.compiler_cost(compiled)["bytes accessed"] == declared
    rows = roofline.instruction_costs(compiled.as_text(), *roofline.compiler_roofline(device))
    assert sum(r["bytes"] for r in rows) == declared

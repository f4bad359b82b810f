"""moe.expert_kernel='pallas' (`moe.expert_kernel`): the experts' FFN kernels (interpret mode on the CPU) against
the einsum path, outputs and gradients, in float32 and bf16, in one block of rows and in several; the MoE layer
with either, on one device and under shard_map on a 4-device mesh; the rows per block and the VMEM check; the
config's refusals; Mosaic compiles both kernels for a v5p, charged what they declare."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt import cli
from gshard_mt.config import Config
from gshard_mt.config.moe import MoeConfig
from gshard_mt.errors import ConfigError
from gshard_mt.kernels import expert_ffn as expert_kernel
from gshard_mt.moe import ffn
from gshard_mt.ops import Ops
from gshard_mt.training import validate
from tests.helpers import ROOT, run_on_cpu_devices


def buffers(E=2, G=3, C=8, M=16, H=32, dtype=jnp.float32, seed=0):
  """x [E, G, C, M] with some all-zero slots (empty capacity), wi, wo float32."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(E, G, C, M))
  x[:, :, -3:] = 0  # empty slots
  return (jnp.asarray(x, dtype), jnp.asarray(rng.normal(size=(E, M, H)) / M**0.5, jnp.float32),
          jnp.asarray(rng.normal(size=(E, H, M)) / H**0.5, jnp.float32))


def plain_ffn(x, wi, wo):
  """What the XLA path computes: `ffn.apply_experts` on the buffers, with a ReLU, no constraints."""
  return ffn.apply_experts(x, ffn.ExpertWeights(wi, wo), ffn.BufferLayout(constrain=False), ffn.relu)


def value_and_grads(fn, x, wi, wo, seed=1):
  """The FFN's output and the gradients of a weighted sum of it in x, wi, wo."""
  probe = jnp.asarray(np.random.default_rng(seed).normal(size=x.shape), jnp.float32)
  loss = lambda x, wi, wo: jnp.sum(fn(x, wi, wo).astype(jnp.float32) * probe)  # noqa: E731
  return fn(x, wi, wo), jax.grad(loss, (0, 1, 2))(x, wi, wo)


def kernel(vmem=None):
  return lambda x, wi, wo: expert_kernel.expert_ffn(x, wi, wo, (), (), vmem)


# 25 KB of VMEM at M=16, H=32 in float32 leaves room for blocks of 8 of the 24 rows only (3 per expert)
@pytest.mark.parametrize("vmem", [None, 25_000], ids=["one-block", "blocks-of-8"])
def test_kernels_equal_the_einsums_in_float32(vmem):
  x, wi, wo = buffers()
  if vmem:
    assert expert_kernel.block_rows(24, 16, 32, 4, vmem) == 8
  out, grads = value_and_grads(kernel(vmem), x, wi, wo)
  want, want_grads = value_and_grads(plain_ffn, x, wi, wo)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  for g, w in zip(grads, want_grads):
    assert g.dtype == w.dtype
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_rows_that_no_block_of_8_divides_are_padded():
  """3 groups of 5 slots: 15 rows per expert, padded to 16 with zeros (empty slots: no output, no gradient)."""
  x, wi, wo = buffers(C=5)
  out, grads = value_and_grads(kernel(), x, wi, wo)
  want, want_grads = value_and_grads(plain_ffn, x, wi, wo)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  for g, w in zip(grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_kernels_equal_the_einsums_in_bfloat16():
  """bf16 buffers: both round the hidden activation and the cotangents to bf16 where the einsums do; the weights'
  gradients stay float32."""
  x, wi, wo = buffers(dtype=jnp.bfloat16)
  out, grads = value_and_grads(kernel(), x, wi, wo)
  want, want_grads = value_and_grads(plain_ffn, x, wi, wo)
  assert out.dtype == jnp.bfloat16 and grads[1].dtype == jnp.float32
  np.testing.assert_allclose(np.float32(out), np.float32(want), rtol=3e-2, atol=3e-2)
  for g, w in zip(grads, want_grads):
    np.testing.assert_allclose(np.float32(g), np.float32(w), rtol=3e-2, atol=3e-2)


def test_block_rows_divide_the_rows_and_fit():
  assert expert_kernel.block_rows(2560, 512, 2048, 2, 64 * 2**20) == 640  # base's encoder buffers on a v5p
  assert expert_kernel.block_rows(24, 16, 32, 4, None) == 24
  assert expert_kernel.block_rows(20, 16, 32, 4, None) == 20  # all rows: Mosaic's rule allows a whole dim
  for R in (2560, 1600, 320):
    T = expert_kernel.block_rows(R, 512, 2048, 2, 64 * 2**20)
    assert R % T == 0 and T % 8 == 0
    assert expert_kernel.vmem_bytes(T, 512, 2048, 2) <= 0.9 * 48 * 2**20
  assert expert_kernel.block_rows(2560, 2048, 8192, 2, 64 * 2**20) is None


def test_tpu_problem_names_what_does_not_fit():
  assert expert_kernel.tpu_problem(64 * 2**20, 512, 2048, 2) is None
  assert "TPU v4 or newer" in expert_kernel.tpu_problem(None, 512, 2048, 2)
  problem = expert_kernel.tpu_problem(64 * 2**20, 1024, 8192, 2)
  assert "M=1024, H=8192" in problem and "48 MiB" in problem


@pytest.mark.parametrize("change, message", [
    ({"activation": "gelu"}, "moe.activation='relu'"),
    ({"dispatch": "grouped"}, "moe.dispatch in"),
    ({"dispatch": "shard_map"}, "moe.dispatch in"),
    ({"expert_kernel": "triton"}, "moe.expert_kernel='triton': expected one of"),
])
def test_config_refuses_what_the_kernels_do_not_compute(change, message):
  with pytest.raises(ConfigError, match=message):
    validate.check(Config(moe=MoeConfig(**{"expert_kernel": "pallas", **change})))


def test_config_refuses_the_experts_hidden_dim_split_over_model():
  from tests.helpers import small_overrides

  with pytest.raises(ConfigError, match=r"moe.expert_kernel='pallas' needs each expert's H whole on a device: "
                                        r"partitioning='expert_model' splits it over the model axis, "
                                        r"mesh.model=1 x dcn_mesh.model=2"):
    cli.load(ROOT / "configs" / "tiny.py", small_overrides(**{
        "moe.expert_kernel": "pallas", "partitioning": "expert_model", "dcn_mesh.model": "2"}))


def moe_layer_outputs_and_grads(kernel_name: str):
  """A MoE layer (index dispatch, float32) on tokens with padding: its output and the gradients of its params."""
  import flax.linen as nn

  from gshard_mt.moe.layer import MoeFeedForward

  cfg = MoeConfig(num_experts=4, hidden_dim=32, group_size=16, second_expert_policy="all", expert_kernel=kernel_name,
                  dispatch="index")
  ops = Ops(expert_ffn=expert_kernel.expert_ffn if kernel_name == "pallas" else None)  # the kernels' seam's pick
  layer = MoeFeedForward(cfg, ops=ops)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(8, 8, 16)), jnp.float32)
  mask = jnp.asarray(rng.random((8, 8)) > 0.2)
  params = nn.unbox(layer.init(jax.random.key(0), x, mask)["params"])
  probe = jnp.asarray(rng.normal(size=x.shape), jnp.float32)

  def loss(params, x):
    y, stats = layer.apply({"params": params}, x, mask)
    return jnp.sum(y * probe) + jnp.sum(stats["aux_loss"])

  y = layer.apply({"params": params}, x, mask)[0]
  return y, jax.grad(loss, (0, 1))(params, x)


def assert_same_layer(got, want):
  (y, grads), (want_y, want_grads) = got, want
  np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
  for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_moe_layer_with_the_kernels_equals_the_einsums():
  assert_same_layer(moe_layer_outputs_and_grads("pallas"), moe_layer_outputs_and_grads("xla"))


def shard_map_check():
  """Run in a process with 4 CPU devices: the layer with the kernels under shard_map on a data=2 x expert=2 mesh
  (experts split 2 ways, groups 2 ways) against the einsums on one device."""
  import flax.linen as nn

  from gshard_mt.parallel import mesh as mesh_lib
  from gshard_mt.parallel import rules as rules_lib
  from tests.helpers import small_config

  want = moe_layer_outputs_and_grads("xla")
  config = small_config(**{"partitioning": "expert", "mesh.data": "2", "mesh.expert": "2"})
  mesh = mesh_lib.make_mesh(config)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules_lib.rules(config)):
    got = moe_layer_outputs_and_grads("pallas")
    text = jax.jit(lambda: moe_layer_outputs_and_grads("pallas")).lower().as_text()
  assert "manual_computation" in text, text[:2000]
  assert_same_layer(got, want)
  print("OK")


@pytest.mark.slow
def test_kernels_run_per_device_under_shard_map():
  run_on_cpu_devices("tests.unit.test_expert_kernel", "shard_map_check")


def test_the_kernels_compile_for_a_tpu_charged_what_they_declare():
  """base's encoder buffers on one v5p chip (8 experts, 32 groups of 80 slots, M=512, H=2048, bf16): two Mosaic
  kernels, and the compiler's estimate of the FFN's gradient within 1.15x of the FLOPs they declare at its
  peak (no weight copied into VMEM ahead of a call, which the estimate would charge again)."""
  from gshard_mt.parallel import chips
  from gshard_mt.tpu.estimates import roofline
  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  device = tpu.topology_devices("v5p:1x1x1")[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  x = jax.ShapeDtypeStruct((8, 32, 80, 512), jnp.bfloat16, sharding=sharding)
  wi = jax.ShapeDtypeStruct((8, 512, 2048), jnp.float32, sharding=sharding)
  wo = jax.ShapeDtypeStruct((8, 2048, 512), jnp.float32, sharding=sharding)
  vmem = chips.chip_of(device.device_kind).vmem_bytes
  loss = lambda x, wi, wo: jnp.sum(expert_kernel.expert_ffn(x, wi, wo, (), (), vmem))  # noqa: E731
  program = jax.jit(jax.grad(loss, (0, 1, 2))).lower(x, wi, wo).compile()
  assert program.as_text().count('custom_call_target="tpu_custom_call"') == 2
  flops_per_s = roofline.compiler_roofline(device)[0]
  declared = 6 * 2 * 8 * 32 * 80 * 512 * 2048 / flops_per_s
  assert tpu.compiler_cost(program)["optimal_seconds"] < 1.15 * declared


def test_build_warns_off_a_tpu_and_refuses_what_does_not_fit_one(caplog):
  """On the CPU: a warning that the kernels are interpreted (none for a dense model). For a v5p (compile-only
  devices, nothing compiled): a one-line refusal, before compiling, of experts whose weights do not fit VMEM."""
  import logging

  from gshard_mt.tpu.estimates import tpu_compiler as tpu
  from gshard_mt.training.setup import build
  from tests.helpers import small_config

  with caplog.at_level(logging.WARNING, logger="gshard_mt.kernels.seam"):
    build(small_config(**{"moe.expert_kernel": "pallas"}), 600)
  assert "moe.expert_kernel='pallas' runs its kernels in Pallas's interpret mode off a TPU (cpu)" in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="gshard_mt.kernels.seam"):
    build(small_config(**{"moe.expert_kernel": "pallas", "model.moe_interval": "0"}), 600)
  assert "interpret mode" not in caplog.text
  devices = tpu.topology_devices("v5p:2x2x1")
  build(small_config(**{"moe.expert_kernel": "pallas", "model.dtype": "bfloat16"}), 600, devices=devices)
  refusal = (r"moe.expert_kernel='pallas' on TPU v5: it holds each expert's weights and their gradients in VMEM: "
             r".* MiB at M=1024, H=8192.*; use moe.expert_kernel='xla'")
  with pytest.raises(ConfigError, match=refusal):
    build(small_config(**{"moe.expert_kernel": "pallas", "model.dtype": "bfloat16", "model.emb_dim": "1024",
                          "moe.hidden_dim": "8192"}), 600, devices=devices)

"""The grouped FFN (moe.dispatch='grouped'): its own backward against autodiff of a plain loop over rows, with
XLA's ragged_dot and with the Mosaic GPU kernels' calls (their contracts checked, their products computed by a
reference here); the Mosaic kernels themselves run by Mosaic GPU's interpreter and lowered for a GPU; which
kernels each backend gets."""

import dataclasses
import functools
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu, transposed_ragged_dot_mgpu

from gshard_mt.errors import ConfigError
from gshard_mt.kernels import mosaic_gpu, seam
from gshard_mt.model.transformer import TransformerConfig
from gshard_mt.moe import ffn, grouped
from gshard_mt.moe.experts import ACTIVATIONS
from tests.helpers import small_config

M, H, E = 8, 16, 4
SIZES = jnp.array([3, 0, 5, 4], jnp.int32)  # an expert with no rows too
BF16 = jnp.bfloat16


def grouped_expert_ffn(rows, sizes, wi, wo, activation=ffn.relu, kernels=None):
  """The experts' FFN (`ffn.apply_experts`) on rows in blocks by expert, by the grouped matmuls of `kernels`."""
  layout = grouped.RowLayout(sizes, rows.shape[0], kernels or grouped.RaggedDot())
  return ffn.apply_experts(rows, ffn.ExpertWeights(wi, wo), layout,
                           activation)


def problem(key=7):
  """rows [R, M], wi, wo (float32) and an output gradient, R = sum(SIZES)."""
  keys = jax.random.split(jax.random.key(key), 4)
  R = int(SIZES.sum())
  return (jax.random.normal(keys[0], (R, M)), jax.random.normal(keys[1], (E, M, H)) / 3,
          jax.random.normal(keys[2], (E, H, M)) / 4, jax.random.normal(keys[3], (R, M)))


def plain(activation, weights_dtype=None):
  """Each row by its own expert's weights, by indexing (no grouped matmul); weights cast to `weights_dtype`."""
  expert_of_row = np.repeat(np.arange(E), np.asarray(SIZES))

  def ffn(rows, wi, wo):
    if weights_dtype is not None:
      wi, wo = wi.astype(weights_dtype), wo.astype(weights_dtype)
    h = activation(jnp.einsum("RM,RMH->RH", rows, wi[expert_of_row]))
    return jnp.einsum("RH,RHM->RM", h, wo[expert_of_row])
  return ffn


def value_and_grads(f, rows, wi, wo, d_out):
  out, vjp = jax.vjp(f, rows, wi, wo)
  return out, *vjp(d_out)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_grouped_expert_ffn_matches_a_loop_over_rows(activation):
  """The grouped FFN's own gradient (float32 weights into the grouped matmuls, their gradients in the weights'
  dtype) against autodiff of a plain loop: row i uses the weights of the expert whose block holds it."""
  act = ACTIVATIONS[activation]
  rows, wi, wo, d_out = problem()

  def ffn(rows, wi, wo):
    return grouped_expert_ffn(rows, SIZES, wi, wo, act)

  for g, r in zip(jax.jit(value_and_grads, static_argnums=0)(ffn, rows, wi, wo, d_out),
                  jax.jit(value_and_grads, static_argnums=0)(plain(act), rows, wi, wo, d_out)):
    np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-5)
  # bf16 rows, float32 weights: outputs and row gradients in bf16, as the plain loop gives them with the weights
  # cast first; the weight gradients in float32.
  got = jax.jit(value_and_grads, static_argnums=0)(ffn, rows.astype(BF16), wi, wo, d_out.astype(BF16))
  want = jax.jit(value_and_grads, static_argnums=0)(plain(act, BF16), rows.astype(BF16), wi, wo, d_out.astype(BF16))
  assert [g.dtype for g in got] == [BF16, BF16, jnp.float32, jnp.float32]
  for g, r in zip(got, want):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), atol=0.05, rtol=0.05)


def test_grouped_expert_ffn_reads_float32_weights_without_a_cast_on_tpu():
  """Compiled for a TPU (libtpu's compile-only devices), the grouped matmuls read the float32 weights: no bf16
  copy of an [E, M, H] weight is made. On the CPU the weights are cast first."""
  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  E_, M_, H_, R = 4, 128, 256, 512
  grad = jax.grad(lambda r, wi, wo, sizes: jnp.sum(grouped_expert_ffn(r, sizes, wi, wo).astype(
      jnp.float32) ** 2), argnums=(0, 1, 2))

  def program(device):
    sharding = jax.sharding.SingleDeviceSharding(device)
    shapes = [((R, M_), BF16), ((E_, M_, H_), jnp.float32), ((E_, H_, M_), jnp.float32), ((E_,), jnp.int32)]
    args = [jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in shapes]
    return jax.jit(grad).lower(*args).compile().as_text()

  cast_weights = re.compile(rf"bf16\[({E_},{M_},{H_}|{E_},{H_},{M_})\]")
  assert not cast_weights.search(program(tpu.topology_devices("v5p:1x1x1")[0]))
  assert cast_weights.search(program(jax.devices("cpu")[0]))


def mosaic_references(monkeypatch) -> list:
  """Replaces the two Mosaic GPU kernels (which run on a Hopper GPU only) by references that check what the real
  ones check (one dtype for both operands, the tiles dividing the dimensions they tile, the rows whole row tiles,
  which the real ones check as they lower) and compute their products
  with XLA's ragged_dot, in the operands' dtype as the kernels write it. Returns the list of calls made."""
  calls = []

  def tiles_of(kw):
    assert set(kw) == {"block_m", "block_n", "block_k", "max_concurrent_steps", "grid_block_n"}
    return kw["block_m"], kw["block_n"], kw["block_k"]

  def ragged_dot(lhs, rhs, *, group_sizes, transpose_rhs=False, **tiles):  # lhs [R, K] rhs [G, K, N] (or [G, N, K])
    _, block_n, block_k = tiles_of(tiles)
    assert lhs.dtype == rhs.dtype
    rhs = rhs.transpose(0, 2, 1) if transpose_rhs else rhs
    assert lhs.shape[1] % block_k == 0 and rhs.shape[2] % block_n == 0, (lhs.shape, rhs.shape, tiles)
    assert lhs.shape[0] % mosaic_gpu.ROW_TILE == 0, lhs.shape
    calls.append(("ragged_dot", transpose_rhs))
    return jax.lax.ragged_dot(lhs, rhs, group_sizes)

  def transposed_ragged_dot(lhs, rhs, *, group_sizes, **tiles):  # lhs [R, X] rhs [R, Y] -> [G, X, Y]
    block_m, block_n, _ = tiles_of(tiles)
    assert lhs.dtype == rhs.dtype and lhs.shape[1] % block_m == 0 and rhs.shape[1] % block_n == 0
    assert lhs.shape[0] % mosaic_gpu.ROW_TILE == 0, lhs.shape
    calls.append(("transposed_ragged_dot", None))
    out = transposed_ragged_dot_mgpu.ref_transposed_ragged_dot(lhs, rhs, group_sizes)
    return out.astype(lhs.dtype)

  monkeypatch.setattr(ragged_dot_mgpu, "ragged_dot", ragged_dot)
  monkeypatch.setattr(transposed_ragged_dot_mgpu, "transposed_ragged_dot", transposed_ragged_dot)
  return calls


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_the_mosaic_gpu_path_matches_a_loop_over_rows(monkeypatch, activation):
  """With the Mosaic GPU kernels' calls (references in their place): bf16 outputs and row gradients as the plain
  loop with the weights cast first, float32 weight gradients (rounded to bf16 once, as the kernel writes them);
  the forward calls x W twice, the backward x W^T twice and the weight-gradient kernel twice."""
  calls = mosaic_references(monkeypatch)
  act = ACTIVATIONS[activation]
  rows, wi, wo, d_out = problem(8)
  kernels = mosaic_gpu.MosaicGpu(block_m=8, block_n=8, block_k=8)

  def ffn(rows, wi, wo):
    return grouped_expert_ffn(rows, SIZES, wi, wo, act, kernels)

  got = jax.jit(value_and_grads, static_argnums=0)(ffn, rows.astype(BF16), wi, wo, d_out.astype(BF16))
  want = jax.jit(value_and_grads, static_argnums=0)(plain(act, BF16), rows.astype(BF16), wi, wo, d_out.astype(BF16))
  assert sorted(calls) == sorted([("ragged_dot", False)] * 2 + [("ragged_dot", True)] * 2
                                 + [("transposed_ragged_dot", None)] * 2)
  assert [g.dtype for g in got] == [BF16, BF16, jnp.float32, jnp.float32]
  for g, r in zip(got, want):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), atol=0.05, rtol=0.05)


grouped_matmul = grouped.grouped_matmul  # the function itself, for a test that wraps the module's name


def interpret_mosaic_gpu(monkeypatch):
  """Every Mosaic GPU kernel call from here on runs in Mosaic GPU's interpret mode on the CPU; the weight-gradient
  kernel, which asks the first device for its SMs, is told of 4."""
  from jax.experimental.pallas import mosaic_gpu as plgpu

  monkeypatch.setattr(plgpu, "kernel", functools.partial(plgpu.kernel, interpret=plgpu.InterpretGPUParams()))
  gpu = types.SimpleNamespace(core_count=4)
  monkeypatch.setattr(transposed_ragged_dot_mgpu, "jax",
                      types.SimpleNamespace(**{**vars(jax), "devices": lambda *a: [gpu]}))


def assert_close(got, want, fraction: float = 0.01):
  """Each leaf within `fraction` of the largest value of its reference (bf16 rounding)."""
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    assert g.shape == w.shape and np.max(np.abs(g - w)) <= fraction * np.max(np.abs(w))


def test_the_mosaic_gpu_kernels_themselves_in_interpret_mode(monkeypatch):
  """The real Mosaic GPU kernels, run by Mosaic GPU's interpreter: the grouped FFN's output and all three
  gradients equal ragged_dot's within bf16 rounding, with uneven blocks, an empty one, and rows a multiple of no
  tile."""
  interpret_mosaic_gpu(monkeypatch)
  E_, M_, H_ = 4, 128, 256
  sizes = jnp.array([100, 0, 150, 50], jnp.int32)
  keys = jax.random.split(jax.random.key(9), 4)
  rows, d_out = (jax.random.normal(k, (300, M_), BF16) for k in keys[:2])
  wi, wo = jax.random.normal(keys[2], (E_, M_, H_)) / M_ ** 0.5, jax.random.normal(keys[3], (E_, H_, M_)) / H_ ** 0.5

  def value_and_grads(kernels):
    out, vjp = jax.vjp(lambda r, a, b: grouped_expert_ffn(r, sizes, a, b, jax.nn.relu, kernels), rows, wi, wo)
    return out, *vjp(d_out)

  got, want = value_and_grads(mosaic_gpu.MosaicGpu()), value_and_grads(grouped.RaggedDot())
  assert [g.dtype for g in got] == [w.dtype for w in want] == [BF16, BF16, jnp.float32, jnp.float32]
  assert_close(got, want)
  assert np.all(np.asarray(got[2][1]) == 0) and np.all(np.asarray(got[3][1]) == 0)  # the empty expert's gradients


def test_the_moe_layer_on_a_hopper_gpu_gets_the_mosaic_kernels(monkeypatch):
  """The MoE layer with the Mosaic GPU kernels the seam picks on a Hopper GPU (mocked; the kernels interpreted):
  the layer's grouped matmuls are the Mosaic kernels, and its loss and gradients (router, experts, input) equal
  those of XLA's ragged_dot within bf16 rounding."""
  import flax.linen as nn

  from gshard_mt.config.moe import MoeConfig
  from gshard_mt.moe.layer import MoeFeedForward
  from gshard_mt.ops import Ops

  def layer(kernel):
    h100 = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3", compute_capability="9.0")
    cfg = MoeConfig(num_experts=4, hidden_dim=256, group_size=128, dispatch="grouped", grouped_kernel=kernel,
                    second_expert_policy="all")
    model_cfg = TransformerConfig.reference(vocab_size=8, emb_dim=128, dtype="bfloat16", moe=cfg)
    return MoeFeedForward(cfg, dtype=BF16, ops=Ops(grouped_matmuls=seam.grouped_matmuls(model_cfg, h100)))

  x = jax.random.normal(jax.random.key(0), (2, 128, 128), BF16)
  params = nn.unbox(layer("ragged_dot").init(jax.random.key(1), x))

  def loss_and_grads(kernel):
    def loss(p, x):
      y, _ = layer(kernel).apply(p, x, deterministic=False, rngs={"gating": jax.random.key(2)})
      return jnp.sum(y.astype(jnp.float32) ** 2)
    return jax.value_and_grad(loss, argnums=(0, 1))(params, x)

  want = loss_and_grads("ragged_dot")
  interpret_mosaic_gpu(monkeypatch)
  chosen = []
  monkeypatch.setattr(grouped, "grouped_matmul", lambda *a: chosen.append(a[-1]) or grouped_matmul(*a))
  assert_close(loss_and_grads("mosaic_gpu"), want)
  assert set(chosen) == {mosaic_gpu.MosaicGpu()} and len(chosen) == 2  # x wi and h wo, traced once


def test_which_kernels_each_backend_gets():
  """The kernels' seam: the Mosaic GPU grouped matmuls on a Hopper GPU only (None: XLA's ragged_dot), refused in one
  line where the GPU or the shapes cannot take them."""
  def picked(device, kernel="mosaic_gpu", dtype="bfloat16", M=128, H=256):
    config = small_config(**{"moe.grouped_kernel": kernel, "moe.dispatch": "grouped"})
    model_cfg = TransformerConfig.from_config(config, 600)
    model_cfg = dataclasses.replace(model_cfg, model=dataclasses.replace(model_cfg.model, emb_dim=M, dtype=dtype),
                                    moe=dataclasses.replace(model_cfg.moe, hidden_dim=H))
    return seam.grouped_matmuls(model_cfg, device)

  cpu = types.SimpleNamespace(platform="cpu", device_kind="cpu")
  a100 = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA A100-SXM4-80GB", compute_capability="8.0")
  h100 = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3", compute_capability="9.0")
  assert picked(cpu) is None
  with pytest.raises(ConfigError, match=r"needs a Hopper GPU \(compute capability 9.x\); NVIDIA A100-SXM4-80GB "
                                        r"has 8.0: use moe.grouped_kernel='ragged_dot'"):
    picked(a100)
  assert picked(h100) == mosaic_gpu.MosaicGpu()
  assert picked(h100, kernel="ragged_dot") is None
  with pytest.raises(ConfigError, match=r"multiplies bf16 or f16 rows, not float32 \(model.dtype\)"):
    picked(h100, dtype="float32")
  with pytest.raises(ConfigError, match=r"model.emb_dim=96: moe.grouped_kernel='mosaic_gpu' needs a multiple of 128"):
    picked(h100, M=96)
  with pytest.raises(ConfigError, match=r"moe.hidden_dim=200: .* multiple of 128"):
    picked(h100, H=200)


def test_the_mosaic_gpu_path_lowers_for_a_gpu(monkeypatch):
  """The real kernels, forward and backward, lowered for CUDA on this CPU host (Mosaic GPU compiles each kernel
  as it lowers, and refuses rows that are not whole tiles of 8, as on the H100): six Mosaic GPU calls and no XLA
  ragged_dot, with rows a multiple of no tile. The weight-gradient kernel asks the first device for its SMs, which
  a CPU device does not have: it is told an H100's 132."""
  gpu = types.SimpleNamespace(core_count=132)
  fake_jax = types.SimpleNamespace(**{**vars(jax), "devices": lambda *a: [gpu]})
  monkeypatch.setattr(transposed_ragged_dot_mgpu, "jax", fake_jax)
  E_, M_, H_, R = 4, 128, 256, 301
  grad = jax.grad(lambda r, wi, wo, sizes: jnp.sum(grouped_expert_ffn(
      r, sizes, wi, wo, jax.nn.relu, mosaic_gpu.MosaicGpu()).astype(jnp.float32) ** 2), argnums=(0, 1, 2))
  args = [jax.ShapeDtypeStruct(s, d) for s, d in [((R, M_), BF16), ((E_, M_, H_), jnp.float32),
                                                  ((E_, H_, M_), jnp.float32), ((E_,), jnp.int32)]]
  text = jax.jit(grad).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert len(re.findall(r"custom_call @mosaic_gpu", text)) == 6
  assert "chlo.ragged_dot" not in text
  forward = jax.jit(lambda r, wi, wo, sizes: grouped_expert_ffn(r, sizes, wi, wo)).trace(*args)
  assert "chlo.ragged_dot" in forward.lower(lowering_platforms=("cuda",)).as_text()  # what XLA's path gives

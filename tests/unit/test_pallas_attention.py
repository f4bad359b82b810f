"""model.attention='pallas' (the attention block, its layer norm included, in Pallas kernels reading the segment
ids; Pallas's interpret mode on the CPU) against 'xla' (the einsum reference): outputs and gradients (inputs,
weights, the norm's scale and bias) of self, causal and cross attention on packed rows, in blocks of 8 rows and
of 1, float32 and bf16; the whole model's loss and gradients, on one device and under shard_map on a mesh; the
kernels' declared cost; the rows per block that fit a TPU's VMEM and the training setup's check; Mosaic
compiles for v4 and v5p; the config's refusal of attention dropout."""

import logging

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from gshard_mt import cli
from gshard_mt.errors import ConfigError
from gshard_mt.kernels import attention as pallas_attention
from gshard_mt.kernels import vmem as pallas_vmem
from tests.helpers import ROOT, run_on_cpu_devices, small_config
from tests.unit.test_fused_attention import (
  attention_outputs_and_gradients,
  packed_batch,
  relative_error,
  transformer_loss_and_grads,
)

# The whole model with one MoE layer a side: each of the three attentions (self, causal, cross) once, as few
# interpreted kernels to compile as cover them.
ONE_MOE_LAYER = {"model.num_encoder_layers": "1", "model.num_decoder_layers": "1", "model.moe_interval": "1"}


@pytest.mark.parametrize("rows", [16, 3], ids=["blocks-of-8", "blocks-of-1"])
@pytest.mark.parametrize("cross, causal", [(False, False), (False, True), (True, False)],
                         ids=["self", "causal", "cross"])
def test_pallas_equals_xla_on_packed_rows(cross, causal, rows):
  out, grads = attention_outputs_and_gradients("pallas", jnp.float32, cross, causal, B=rows)
  want_out, want_grads = attention_outputs_and_gradients("xla", jnp.float32, cross, causal, B=rows)
  np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
  assert relative_error(grads, want_grads) < 1e-5


@pytest.mark.parametrize("residual", [jnp.bfloat16, jnp.float32], ids=["bf16-residual", "float32-residual"])
@pytest.mark.parametrize("cross, causal", [(False, True), (True, False)], ids=["causal", "cross"])
def test_pallas_equals_xla_in_bfloat16(cross, causal, residual):
  """bf16 computation on a bf16 or float32 residual stream (the default: float32 x and dx blocks, bf16 kv and
  dy): the kernels round q, k, v, the probabilities and the cotangents where the einsums do, so both agree to
  bf16's precision."""
  out, grads = attention_outputs_and_gradients("pallas", jnp.bfloat16, cross, causal, B=16, residual=residual)
  want_out, want_grads = attention_outputs_and_gradients("xla", jnp.bfloat16, cross, causal, B=16, residual=residual)
  np.testing.assert_allclose(out, want_out, rtol=3e-2, atol=3e-2)
  assert relative_error(grads, want_grads) < 3e-2


def test_transformer_loss_and_gradients_equal_xla():
  """A training step's loss (MoE layers, residual dropout on) and its gradients, from the same parameters."""
  config = small_config(**{"model.dtype": "float32", "model.dropout_rate": "0.1", **ONE_MOE_LAYER})
  batch = packed_batch(config.batch_size, config.data.max_length, config.data.vocab_size)
  (loss, grads), (want_loss, want_grads) = (transformer_loss_and_grads(config, a, batch) for a in ("pallas", "xla"))
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
  assert relative_error(grads, want_grads) < 1e-5


def shard_map_check():
  """Run in a process with 4 CPU devices: loss and gradients of 'pallas' on the config's mesh (rows split 4 ways
  over 'data', the kernels under shard_map) against 'xla' on one device."""
  import flax.linen as nn

  from gshard_mt.training.setup import build

  config = small_config(**{"model.dtype": "float32", "model.dropout_rate": "0.0", "batch_size": "16",
                           "mesh.data": "4", **ONE_MOE_LAYER})
  batch = packed_batch(16, config.data.max_length, config.data.vocab_size)
  want_loss, want_grads = transformer_loss_and_grads(config, "xla", batch)
  setup = build(config, config.data.vocab_size)
  with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
    loss, grads = transformer_loss_and_grads(config, "pallas", batch)
    text = jax.jit(lambda: transformer_loss_and_grads(config, "pallas", batch)).lower().as_text()
  assert setup.mesh.shape["data"] == 4 and "manual_computation" in text, text[:2000]
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
  assert relative_error(grads, want_grads) < 1e-5
  print("OK")


@pytest.mark.slow
def test_kernels_run_per_device_under_shard_map():
  run_on_cpu_devices("tests.unit.test_pallas_attention", "shard_map_check")


def block_of(cross: bool, causal: bool, vmem=None):
  """The kernels as a function of (x, kv, scale, bias, wq, wk, wv, wo, q ids, k ids), bf16 computation (kv is not
  read for self-attention)."""
  def block(x, kv, scale, bias, wq, wk, wv, wo, q_segments, k_segments):
    return pallas_attention.pallas_attention(x, kv if cross else None, (scale, bias), (wq, wk, wv, wo), q_segments,
                                             k_segments, causal=causal, dtype=jnp.bfloat16, vmem=vmem)
  return block


def block_shapes(B, Q, K, M, A, D, device=None, residual=jnp.bfloat16) -> list:
  """Abstract arguments of `block_of`'s function (on `device`, if given): x in `residual`, bf16 kv, float32
  parameters, int32 segment ids."""
  sharding = device and jax.sharding.SingleDeviceSharding(device)
  shapes = [((B, Q, M), residual), ((B, K, M), jnp.bfloat16), ((M,), jnp.float32), ((M,), jnp.float32),
            *[((M, A, D), jnp.float32)] * 3, ((A, D, M), jnp.float32), ((B, Q), jnp.int32), ((B, K), jnp.int32)]
  return [jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in shapes]


GRADS = (0, 1, 2, 3, 4, 5, 6, 7)  # every floating-point argument of `block_of`'s function


def tpu_kernels(block, args) -> int:
  """The Mosaic kernels in the compiled gradient of sum(block(args)^2), `args` on a TPU's compile-only device."""
  loss = lambda *a: jnp.sum(block(*a).astype(jnp.float32) ** 2)  # noqa: E731
  return jax.jit(jax.grad(loss, GRADS)).lower(*args).compile().as_text().count(
      'custom_call_target="tpu_custom_call"')


def declared_costs(fn, *args):
  """The cost each kernel in `fn`'s jaxpr declares, in order (each kernel is there twice, as platform_dependent's
  TPU and interpreted branches, with the same cost)."""
  jaxpr = jax.make_jaxpr(fn)(*args)
  costs = [e.params["cost_estimate"] for e in _pallas_calls(jaxpr.jaxpr)]
  assert costs[::2] == costs[1::2]
  return costs[::2]


def _pallas_calls(jaxpr):
  """Every pallas_call equation in `jaxpr` and the jaxprs in its equations' parameters (branches, bodies)."""
  for e in jaxpr.eqns:
    if e.primitive.name == "pallas_call":
      yield e
      continue
    for value in e.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(sub, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
          yield from _pallas_calls(getattr(sub, "jaxpr", sub))


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_declared_cost_counts_the_matmuls_and_bytes(cross):
  """Each kernel declares its matmuls' FLOPs (counted here from what the block computes) and the bytes of its
  operands and outputs."""
  B, Q, K, M, A, D = 16, 8, 24 if cross else 8, 32, 4, 8
  AD = A * D
  args = block_shapes(B, Q, K, M, A, D)
  block = block_of(cross, causal=False)
  [forward] = declared_costs(block, *args)
  project = lambda rows: 2 * rows * M * AD  # noqa: E731  one [rows, M] x [M, A·D] matmul (or its transpose)
  head = 2 * B * Q * K * AD  # one [Q, K] x D matmul for every row and head
  assert isinstance(forward, pl.CostEstimate)
  assert forward.flops == 2 * project(B * Q) + 2 * project(B * K) + 2 * head  # q, output | k, v | scores, pv
  # x (and kv) in bf16, the four weights cast to bf16 before the kernels, the norm's float32 scale and bias, the
  # segment ids
  rows_in = 2 * B * Q * M + (2 * B * K * M if cross else 0)
  inputs = rows_in + 4 * 2 * M * AD + 2 * 4 * M + 4 * B * (Q + K)
  assert forward.bytes_accessed == inputs + 2 * B * Q * M
  loss = lambda *a: jnp.sum(block(*a).astype(jnp.float32))  # noqa: E731
  _, backward = declared_costs(jax.grad(loss, GRADS), *args)
  # per query row: q (recomputed), do, dwo, dwq, dxq | per key row: k, v (recomputed), dwk, dwv, dxk, dxv | per
  # row and head: scores, pv (both recomputed), dv, dp, dq, dk
  assert backward.flops == 5 * project(B * Q) + 6 * project(B * K) + 6 * head
  cores = 2  # 16 rows: two blocks of 8, one per TensorCore, each with its float32 partials of the 6 parameters
  assert backward.bytes_accessed == (inputs + 2 * B * Q * M) + rows_in + cores * 4 * (4 * M * AD + 2 * M)


def test_the_weights_gradients_are_summed_over_blocks_and_cores():
  """Four blocks of 8 rows, two on each core: every block's weight gradients are added into its core's partial."""
  out, grads = attention_outputs_and_gradients("pallas", jnp.float32, False, True, B=32)
  want_out, want_grads = attention_outputs_and_gradients("xla", jnp.float32, False, True, B=32)
  np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
  assert relative_error(grads, want_grads) < 1e-5


def test_pallas_attention_refuses_attention_dropout():
  with pytest.raises(ConfigError, match=r"model.attention='pallas' has no attention dropout: it needs "
                                        r"model.attention_dropout_rate=0, not 0.1"):
    cli.load(ROOT / "configs" / "tiny.py", {"model.attention": "pallas", "model.attention_dropout_rate": "0.1"})


def test_build_warns_that_it_is_interpreted_off_a_tpu(caplog):
  from gshard_mt.training.setup import build

  with caplog.at_level(logging.WARNING, logger="gshard_mt.kernels.seam"):
    build(small_config(**{"model.attention": "pallas"}), 600)
  assert "model.attention='pallas' runs its kernels in Pallas's interpret mode off a TPU (cpu)" in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="gshard_mt.kernels.seam"):
    build(small_config(), 600)
  assert "interpret mode" not in caplog.text


@pytest.mark.parametrize("cross, causal", [(False, True), (True, False)], ids=["causal", "cross"])
def test_the_kernels_compile_for_a_tpu(cross, causal):
  """The Mosaic kernels lower and fit VMEM for a TPU (libtpu's compile-only devices): forward and backward of a
  decoder's rows (40 target positions, 64 source: rows that are not whole bf16 tiles), on two cores' blocks."""
  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  device = tpu.topology_devices("v5p:1x1x1")[0]
  assert tpu_kernels(block_of(cross, causal), block_shapes(32, 40, 64 if cross else 40, 128, 2, 64, device)) == 2


MIB = 2**20


# What the compiler holds in VMEM for a backward kernel in blocks of 8 rows, as a v4's out-of-VMEM error reports it
# (libtpu 0.0.52): (Q, K, M, A·D, residual and computation itemsize) -> MiB. Self-attention over dense_base's
# encoder rows with a bf16 and a float32 residual stream; cross-attention over its decoder rows.
COMPILER_VMEM_MIB = {(64, 64, 512, 512, 2, 2): 21.04, (64, 64, 512, 512, 4, 2): 23.04,
                     (40, 64, 512, 512, 4, 2): 21.45}


@pytest.mark.parametrize("shape", COMPILER_VMEM_MIB)
def test_vmem_bytes_is_within_the_spare_of_the_compilers_figure(shape):
  """Short by less than the tenth `block_rows` keeps spare, and never more than 15% over."""
  estimate = pallas_vmem.vmem_bytes(8, *shape) / MIB
  assert pallas_vmem.SPARE * COMPILER_VMEM_MIB[shape] <= estimate <= 1.15 * COMPILER_VMEM_MIB[shape]


def test_blocks_shrink_to_fit_the_tpus_vmem():
  """dense_base's encoder rows (64 x 64, M = A·D = 512, bf16): blocks of 8 rows in the 48 MiB the kernels may use
  on a v5p, of 4 in a v4's 16 MiB; at M = A·D = 1024 no block fits a v4, and the training setup's check says so."""
  dense_base = (64, 64, 512, 512, 2, 2)
  assert pallas_vmem.block_rows(*dense_base, vmem=64 * MIB) == 8
  assert pallas_vmem.block_rows(*dense_base, vmem=None) == 8  # not known: the kernels' own limit
  assert pallas_vmem.block_rows(*dense_base, vmem=16 * MIB) == 4
  assert pallas_vmem.tpu_problem(16 * MIB, (64, 40), 512, 512, 2, 2) is None
  assert pallas_vmem.tpu_problem(16 * MIB, (64, 40), 1024, 1024, 2, 2) == (
      "its backward kernel needs 28.0 MiB of VMEM at M=1024, A·D=1024, rows of 64/40, more than the 16 MiB it may "
      "use here")
  assert pallas_vmem.tpu_problem(None, (64, 40), 512, 512, 2, 2) == "its Mosaic kernels need a TPU v4 or newer"
  assert pallas_vmem.tpu_problem(64 * MIB, (64, 36), 512, 512, 2, 2) == (
      "its kernels need row lengths that are multiples of 8, not (64, 36)")


def test_the_training_setup_tells_the_model_the_tpus_vmem_or_refuses(caplog):
  from types import SimpleNamespace

  from gshard_mt.kernels import seam
  from gshard_mt.training.setup import TransformerConfig

  def configured(kind, platform="tpu", **overrides):
    """The VMEM the seam tells the attention kernel it picks on a device of `kind`."""
    config = small_config(**{"model.attention": "pallas", **overrides})
    model_cfg = TransformerConfig.from_config(config, 600)
    assert seam.pallas_options(config, model_cfg) == ["model.attention"]
    ops = seam.pick(config, model_cfg, SimpleNamespace(platform=platform, device_kind=kind))
    assert ops.attention.func is pallas_attention.pallas_attention and ops.expert_ffn is None
    return SimpleNamespace(kernel_vmem=ops.attention.keywords["vmem"])

  assert configured("TPU v5").kernel_vmem == 64 * MIB
  assert configured("TPU v4").kernel_vmem == 16 * MIB
  assert configured("TPU v9 someday").kernel_vmem is None  # a TPU the table does not know: the compiler decides
  with pytest.raises(ConfigError, match=r"^model.attention='pallas' on TPU v4: its backward kernel needs [\d.]+ MiB "
                                        r"of VMEM at M=1024, A·D=1024, .*; use model.attention='xla'$"):
    configured("TPU v4", **{"model.emb_dim": "1024", "model.num_heads": "16", "model.head_dim": "64"})
  with pytest.raises(ConfigError, match=r"on TPU v3: its Mosaic kernels need a TPU v4 or newer"):
    configured("TPU v3")
  with caplog.at_level(logging.WARNING, logger="gshard_mt.kernels.seam"):
    assert configured("cpu", platform="cpu").kernel_vmem is None
  assert "interpret mode off a TPU (cpu)" in caplog.text


@pytest.mark.parametrize("topology, residual", [("v4:1x1x1", jnp.bfloat16), ("v4:1x1x1", jnp.float32),
                                               ("v5p:1x1x1", jnp.bfloat16)], ids=["v4", "v4-float32-residual", "v5p"])
def test_dense_base_rows_compile_within_the_tpus_vmem(topology, residual):
  """dense_base's encoder block (64 x 64 rows, M = A·D = 512) with the rows `block_rows` picks for the TPU's VMEM:
  the compiler fits it (blocks of 8 alone would not fit a v4)."""
  from gshard_mt.parallel import chips
  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  device = tpu.topology_devices(topology)[0]
  vmem = chips.chip_of(device.device_kind).vmem_bytes
  assert tpu_kernels(block_of(False, False, vmem), block_shapes(16, 64, 64, 512, 8, 64, device, residual)) == 2

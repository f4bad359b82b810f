"""model.logits='pallas' (`pallas_logits`: the logits' statistics in Pallas kernels; Pallas's interpret mode on the
CPU) against the plain computation from materialised logits: the four statistics and the gradients through the
first three, in one block and in several blocks of rows and of vocabulary; argmax ties; the declared costs; a TPU
compile."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.model import pallas_logits
from tests.unit.test_pallas_attention import declared_costs


def reference(y, w, targets):
  z = jnp.einsum("BLM,MV->BLV", y.astype(jnp.float32), w.astype(jnp.float32))
  target = jnp.take_along_axis(z, targets[..., None], -1)[..., 0]
  return jax.nn.logsumexp(z, -1), target, z.sum(-1), jnp.argmax(z, -1)


def inputs(B=4, L=8, M=32, V=384, seed=0):
  rng = np.random.default_rng(seed)
  y = jnp.asarray(rng.normal(size=(B, L, M)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(M, V)) / np.sqrt(M), jnp.float32)
  return y, w, jnp.asarray(rng.integers(0, V, (B, L)), jnp.int32), jnp.asarray(rng.normal(size=(3, B, L)), jnp.float32)


@pytest.mark.parametrize("rows, vocab", [(1024, 2048), (8, 128)], ids=["one-block", "4x3-blocks"])
def test_statistics_and_gradients_equal_the_plain_computation(monkeypatch, rows, vocab):
  monkeypatch.setattr(pallas_logits, "ROWS", rows)
  monkeypatch.setattr(pallas_logits, "MAX_VOCAB_BLOCK", vocab)
  y, w, targets, cotangents = inputs()

  def weighted(fn, y, w):
    return sum(jnp.sum(s * c) for s, c in zip(fn(y, w, targets)[:3], cotangents))

  got, want = pallas_logits.logit_statistics(y, w, targets), reference(y, w, targets)
  for g, r in zip(got[:3], want[:3]):
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got[3], want[3])
  assert got[3].dtype == jnp.int32
  got_grads = jax.grad(lambda y, w: weighted(pallas_logits.logit_statistics, y, w), (0, 1))(y, w)
  want_grads = jax.grad(lambda y, w: weighted(reference, y, w), (0, 1))(y, w)
  for g, r in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def test_argmax_ties_give_the_first_id_across_vocabulary_blocks(monkeypatch):
  monkeypatch.setattr(pallas_logits, "MAX_VOCAB_BLOCK", 128)
  y, w, targets, _ = inputs(B=1, L=8, M=8, V=384)
  y = jnp.abs(y)
  w = w.at[:, 5].set(10.0).at[:, 130].set(10.0).at[:, 300].set(10.0)  # ids 5, 130, 300 tie as every row's max
  np.testing.assert_array_equal(pallas_logits.logit_statistics(y, w, targets)[3], 5)
  w = w.at[:, 5].set(0.0)
  np.testing.assert_array_equal(pallas_logits.logit_statistics(y, w, targets)[3], 130)


def test_vocab_block_divides_the_vocabulary():
  assert pallas_logits.vocab_block(16000) == 640
  assert pallas_logits.vocab_block(32000) == 1280
  assert pallas_logits.vocab_block(32768) == 2048
  assert pallas_logits.vocab_block(1000) == 1000  # no multiple of 128 divides it: the whole vocabulary


def test_declared_costs_count_the_matmuls_and_the_rereads(monkeypatch):
  """Forward: one matmul, W read once per block of rows; each backward kernel: the logits again and its own
  matmul, the dW kernel reading y (and the targets and statistics) once per vocabulary block."""
  monkeypatch.setattr(pallas_logits, "ROWS", 8)
  monkeypatch.setattr(pallas_logits, "MAX_VOCAB_BLOCK", 128)
  B, L, M, V = 4, 8, 32, 384
  N, row_blocks, vocab_blocks = B * L, 4, 3
  y = jax.ShapeDtypeStruct((B, L, M), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((M, V), jnp.float32)
  t = jax.ShapeDtypeStruct((B, L), jnp.int32)
  [forward] = declared_costs(pallas_logits.logit_statistics, y, w, t)
  matmul = 2 * N * M * V
  assert forward.flops == matmul and forward.transcendentals == N * V
  assert forward.bytes_accessed == 2 * N * M + 4 * M * V * row_blocks + 4 * N + 4 * N * 4
  loss = lambda y, w: sum(jnp.sum(s) for s in pallas_logits.logit_statistics(y, w, jnp.zeros((B, L), jnp.int32))[:3])  # noqa: E731
  _, dy, dw = declared_costs(jax.grad(loss, (0, 1)), y, w)
  assert dy.flops == dw.flops == 2 * matmul
  per_row = 4 + 4 * 4  # the target and the four numbers g
  assert dy.bytes_accessed == 2 * N * M + 4 * M * V * row_blocks + N * per_row + 2 * N * M
  assert dw.bytes_accessed == 2 * N * M * vocab_blocks + 4 * M * V + N * per_row * vocab_blocks + 4 * M * V


def test_the_kernels_compile_for_a_tpu():
  """The three Mosaic kernels lower and fit VMEM for a TPU (libtpu's compile-only devices) at dense_base's
  per-chip target rows and vocabulary (5,120 rows, M=512, V=16,000: 5 blocks of rows, 25 of vocabulary)."""
  from gshard_mt.compiler import tpu

  sharding = jax.sharding.SingleDeviceSharding(tpu.topology_devices("v5p:1x1x1")[0])
  args = [jax.ShapeDtypeStruct(s, d, sharding=sharding) for s, d in
          (((128, 40, 512), jnp.bfloat16), ((512, 16000), jnp.float32), ((128, 40), jnp.int32))]
  loss = lambda y, w, t: sum(jnp.sum(s) for s in pallas_logits.logit_statistics(y, w, t)[:3])  # noqa: E731
  text = jax.jit(jax.grad(loss, (0, 1))).lower(*args).compile().as_text()
  assert text.count('custom_call_target="tpu_custom_call"') == 3

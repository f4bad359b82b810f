"""The loss's reductions of the logits in one pass (`kernels.logit_stats`): the Pallas kernel (interpret mode on
the CPU) against the jnp reductions, float32 and bf16 (ties of the maximum included), in one block and in many;
the custom gradient against autodiff of the jnp reductions; Mosaic compiles the kernel for a v5p, charged its
bytes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.kernels import logit_stats


def logits_and_targets(N: int, V: int, dtype, seed: int = 0):
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(N, V)) * 3
  z[0, [3, 7]] = z[0].max() + 1  # a tie for the maximum: the argmax is the first
  return jnp.asarray(z, dtype), jnp.asarray(rng.integers(0, V, N), jnp.int32)


@pytest.mark.parametrize("block_bytes", [4 << 20, 1 << 12], ids=["one-block", "blocks-of-8-rows"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_kernel_equals_the_jnp_reductions(dtype, block_bytes, monkeypatch):
  monkeypatch.setattr(logit_stats, "BLOCK_BYTES", block_bytes)
  z, t = logits_and_targets(32, 100, dtype)  # V not a multiple of 128
  got = jax.jit(lambda z, t: logit_stats.kernel(z, t[:, None], interpret=True))(z, t)
  expected = logit_stats.reference(z, t)
  for g, e in zip(got[:3], expected[:3]):
    np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-5)
  np.testing.assert_array_equal(got[3], expected[3])
  assert int(got[3][0]) == 3


def test_the_gradient_is_autodiffs_of_the_jnp_reductions():
  z, t = logits_and_targets(12, 50, jnp.float32)
  z, t = z.reshape(3, 4, 50), t.reshape(3, 4)
  weights = jnp.asarray(np.random.default_rng(1).normal(size=(3, 3, 4)), jnp.float32)

  def loss(stats_fn, z):
    return sum(jnp.sum(w * s) for w, s in zip(weights, stats_fn(z, t)[:3]))

  def by_reference(z, t):
    return tuple(s.reshape(3, 4) for s in logit_stats.reference(z.reshape(-1, 50), t.reshape(-1)))

  np.testing.assert_allclose(jax.grad(lambda z: loss(logit_stats.logit_stats, z))(z),
                             jax.grad(lambda z: loss(by_reference, z))(z), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(logit_stats.logit_stats(z, t)[3], by_reference(z, t)[3])


def test_rows_that_no_block_tiles_take_jnp():
  assert logit_stats._rows_per_block(12, 1 << 20) is None  # one float32 row is over the block budget
  z, t = logits_and_targets(12, 64, jnp.float32)
  assert logit_stats._rows_per_block(12, 64) == 12


def test_the_kernel_compiles_for_a_tpu_and_reads_the_logits_where_the_matmul_wrote_them():
  """dense_base's target rows per chip (128 x 40), M=512 and vocabulary (16,000) in bf16 on a v5p: one Mosaic
  kernel, and the logits go from their matmul to it without a copy (its (L, B) rows are the TPU's layout)."""
  import re

  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  device = tpu.topology_devices("v5p:1x1x1")[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  y = jax.ShapeDtypeStruct((128, 40, 512), jnp.bfloat16, sharding=sharding)
  w = jax.ShapeDtypeStruct((512, 16000), jnp.bfloat16, sharding=sharding)
  t = jax.ShapeDtypeStruct((128, 40), jnp.int32, sharding=sharding)
  loss = lambda y, w, t: sum(jnp.sum(s) for s in logit_stats.logit_stats(jnp.einsum("BLM,MV->BLV", y, w), t)[:3])  # noqa: E731
  text = jax.jit(jax.grad(loss, (0, 1))).lower(y, w, t).compile().as_text()
  assert text.count('custom_call_target="tpu_custom_call"') == 1
  entry = text.split("\nENTRY")[1].splitlines()
  assert not [line for line in entry if re.search(r"16000\]\{[^}]*\} (copy|transpose)\(", line)]

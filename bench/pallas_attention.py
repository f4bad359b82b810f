"""What a Pallas attention kernel over our short rows would be charged by the TPU compiler's estimate (an estimate,
not a measurement), and where that charge goes: the step before building one into the model (issue 25).

  python bench/pallas_attention.py [--topology v5p:2x2x1]

The kernel: the forward of one attention core (QK^T, the packing mask from segment ids, softmax, PV) for blocks of
8 rows x one head, each row's scores whole in VMEM (64 positions need no online softmax), q, k, v laid out
[B, A, L, D] as its blocks read them. It declares its cost (`pl.CostEstimate`): the FLOPs of its two matmuls and
the bytes of its operands and output, or, in the second row, no bytes at all, to show what the compiler adds around
the call. First checked in Pallas's interpret mode against the einsum reference on the CPU; then compiled for
dense_base's per-chip batch of encoder self-attention (128 rows x 64 tokens, 8 heads of 64, bf16) on the
compile-only devices of --topology, beside the same forward as einsums (`gshard_mt.model.layers`).
"""

from __future__ import annotations

import argparse

from gshard_mt import cli

ROWS = 8  # rows per kernel block


def main(argv):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--topology", default="v5p:2x2x1")
  args = p.parse_args(argv)
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.experimental import pallas as pl

  from gshard_mt.compiler import tpu
  from gshard_mt.model import layers

  def kernel(q_ref, k_ref, v_ref, qs_ref, ks_ref, o_ref):  # [ROWS, 1, L, D] each, segment ids [ROWS, L]
    for r in range(ROWS):
      s = jax.lax.dot_general(q_ref[r, 0], k_ref[r, 0], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
      qs, ks = qs_ref[r], ks_ref[r]
      probs = jax.nn.softmax(jnp.where((qs[:, None] == ks[None, :]) & (ks[None, :] > 0), s, layers.NEG_INF), -1)
      o_ref[r, 0] = jnp.dot(probs.astype(o_ref.dtype), v_ref[r, 0], preferred_element_type=jnp.float32).astype(
          o_ref.dtype)

  def pallas_core(q, k, v, segments, declare_bytes=True, interpret=False):  # q, k, v [B, A, L, D]
    B, A, L, D = q.shape
    block = pl.BlockSpec((ROWS, 1, L, D), lambda b, a: (b, a, 0, 0))
    ids = pl.BlockSpec((ROWS, L), lambda b, a: (b, 0))
    nbytes = 4 * q.size * q.dtype.itemsize + 2 * segments.size * segments.dtype.itemsize
    cost = pl.CostEstimate(flops=4 * B * A * L * L * D, transcendentals=B * A * L * L,
                           bytes_accessed=nbytes if declare_bytes else 0)
    return pl.pallas_call(kernel, grid=(B // ROWS, A), in_specs=[block, block, block, ids, ids], out_specs=block,
                          out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), cost_estimate=cost,
                          interpret=interpret)(q, k, v, segments, segments)

  def einsum_core(q, k, v, segments):  # the model's 'xla' attention, [B, A, L, D] in and out
    t = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
    probs = layers.attention_probs(t(q), t(k), layers.attention_bias(segments, segments, causal=False))
    return jnp.einsum("BAQK,BKAD->BAQD", probs.astype(v.dtype), t(v))

  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(16, 4, 64, 32)) * scale, jnp.bfloat16) for scale in (32**-0.5, 1, 1))
  segments = jnp.asarray(np.minimum(np.arange(64) // 20 + 1, 3)[None].repeat(16, 0) * (np.arange(64) < 60), jnp.int32)
  real = np.asarray(segments > 0)[:, None, :, None]
  got, want = pallas_core(q, k, v, segments, interpret=True), einsum_core(q, k, v, segments)
  # Relative to the largest output, as tests/unit/test_fused_attention.py measures bf16 attention: the einsums round
  # the logits to bf16, the kernel keeps them in float32.
  error = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32)) * real) / jnp.max(jnp.abs(want)))
  print(f"interpret mode against the einsums, bf16, real positions: max |difference| / max |output| {error:.2g}")
  if error > 1.5e-2:
    raise SystemExit("the kernel disagrees with the reference")

  sharding = jax.sharding.SingleDeviceSharding(tpu.topology_devices(args.topology)[0])
  qkv = jax.ShapeDtypeStruct((128, 8, 64, 64), jnp.bfloat16, sharding=sharding)
  ids = jax.ShapeDtypeStruct((128, 64), jnp.int32, sharding=sharding)
  print("| forward of one attention core, 128 rows x 64 | compiler's optimal_seconds | bytes it counts |")
  print("|---|---|---|")
  for name, fn in (("einsums (model.attention='xla')", einsum_core),
                   ("Pallas kernel, declared FLOPs and bytes", pallas_core),
                   ("Pallas kernel, declared FLOPs, 0 bytes", lambda *a: pallas_core(*a, declare_bytes=False))):
    cost = tpu.compiler_cost(jax.jit(fn).lower(qkv, qkv, qkv, ids).compile())
    print(f"| {name} | {cost['optimal_seconds'] * 1e6:.0f} us | {cost['bytes accessed'] / 2**20:.0f} MiB |",
          flush=True)


if __name__ == "__main__":
  cli.run(main, prog="python bench/pallas_attention.py")

"""Where the unattributed half of the TPU estimate goes: the attention core's batched matmuls at our row lengths.
The compiler's estimate (not a measurement) of one attention core (QK^T, softmax, PV; forward + backward) on
dense_base's per-chip batch (128 rows x 64 source tokens, 8 heads of 64, bf16), with r rows concatenated into
one attention block of r x 64 positions (the mask keeps them apart, so the FLOPs grow r times), against the
per-instruction roofline (`gshard_mt.tpu.estimates.roofline`: FLOPs at peak, bytes at bandwidth).

  python bench/attention_blocks.py [--topology v5p:2x2x1]
"""

from __future__ import annotations

import argparse

from gshard_mt import cli


def main(argv):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--topology", default="v5p:2x2x1")
  args = p.parse_args(argv)
  import jax
  import jax.numpy as jnp

  from gshard_mt.tpu.estimates import roofline
  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  device, sharding = tpu.one_chip(args.topology)
  B, L, A, D = 128, 64, 8, 64

  def core(q, k, v, bias):  # q, k, v [B, L, A, D], bias [B, 1, L, L]
    logits = jnp.einsum("BQAD,BKAD->BAQK", q, k).astype(jnp.float32) + bias
    return jnp.einsum("BAQK,BKAD->BQAD", jax.nn.softmax(logits, -1).astype(q.dtype), v)

  loss = jax.grad(lambda *a: jnp.sum(core(*a).astype(jnp.float32) ** 2), argnums=(0, 1, 2))
  print("| rows per block | positions | compiler's optimal_seconds | per-instruction roofline |")
  print("|---|---|---|---|")
  for r in (1, 2, 4):
    qkv = jax.ShapeDtypeStruct((B // r, r * L, A, D), jnp.bfloat16, sharding=sharding)
    bias = jax.ShapeDtypeStruct((B // r, 1, r * L, r * L), jnp.float32, sharding=sharding)
    compiled = jax.jit(loss).lower(qkv, qkv, qkv, bias).compile()
    total, attributed = roofline.estimate_and_attributed(compiled, device)
    print(f"| {r} | {r * L} | {total * 1e6:.0f} us | {attributed * 1e6:.0f} us |", flush=True)


if __name__ == "__main__":
  cli.run(main)

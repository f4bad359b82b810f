"""One attention core on the TPU compiler's estimate (an estimate, not a measurement): model.attention='pallas'
(`gshard_mt.model.pallas_attention`: Pallas kernels with a declared cost) against the einsums of 'xla'.

  python bench/pallas_attention.py [--topology v5p:2x2x1]

dense_base's per-chip encoder self-attention (128 rows x 64 tokens, 8 heads of 64, bf16, three pairs per row),
forward and forward + backward (the loss: the sum of squared outputs), compiled for one device of --topology.
The kernels' equality with the einsums is tested in tests/unit/test_pallas_attention.py (interpret mode).
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

  from gshard_mt.compiler import tpu
  from gshard_mt.model import layers
  from gshard_mt.model.pallas_attention import pallas_attention

  def einsum_core(q, k, v, segments):  # the model's 'xla' attention
    probs = layers.attention_probs(q, k, layers.attention_bias(segments, segments, causal=False))
    return jnp.einsum("BAQK,BKAD->BQAD", probs.astype(v.dtype), v)

  def pallas_core(q, k, v, segments):
    B, L, A, D = q.shape  # from the einsums' layout, as the model gave them before its projections were lane-dense
    lanes = lambda x: x.reshape(B, L, A * D)  # noqa: E731
    return pallas_attention(lanes(q), lanes(k), lanes(v), segments, segments, heads=A, causal=False).reshape(q.shape)

  _, sharding = tpu.one_chip(args.topology)
  qkv = jax.ShapeDtypeStruct((128, 64, 8, 64), jnp.bfloat16, sharding=sharding)
  ids = jax.ShapeDtypeStruct((128, 64), jnp.int32, sharding=sharding)
  print("| one attention core, 128 rows x 64, bf16 | forward | forward + backward | bytes it counts (f + b) |")
  print("|---|---|---|---|")
  for name, core in (("einsums (model.attention='xla')", einsum_core), ("Pallas kernels ('pallas')", pallas_core)):
    forward = tpu.compiler_cost(jax.jit(core).lower(qkv, qkv, qkv, ids).compile())
    grad = jax.grad(lambda q, k, v, s, c=core: jnp.sum(c(q, k, v, s).astype(jnp.float32) ** 2), (0, 1, 2))
    both = tpu.compiler_cost(jax.jit(grad).lower(qkv, qkv, qkv, ids).compile())
    print(f"| {name} | {forward['optimal_seconds'] * 1e6:.0f} us | {both['optimal_seconds'] * 1e6:.0f} us | "
          f"{both['bytes accessed'] / 2**20:.0f} MiB |", flush=True)


if __name__ == "__main__":
  cli.run(main, prog="python bench/pallas_attention.py")

"""The attention block on the TPU compiler's estimate (an estimate, not a measurement): model.attention='pallas'
(`gshard_mt.kernels.attention`: the whole block in Pallas kernels with a declared cost) against the einsums
of 'xla'.

  python bench/pallas_attention.py [--topology v5p:2x2x1]

dense_base's per-chip rows (128 rows of 64 source / 40 target positions, M=512, 8 heads of 64, a bf16 residual
stream, float32 weights): the model's own `Attention` module, its layer norm included, as the encoder's
self-attention, the decoder's causal self-attention and its cross-attention, forward and forward + backward (the
loss: the sum of squared outputs; gradients of the inputs, the weights and the norm's scale and bias), compiled
for one device of --topology. The kernels' equality with the einsums is tested in
tests/unit/test_pallas_attention.py (interpret mode).
"""

from __future__ import annotations

import argparse
import functools

from gshard_mt import cli

BLOCKS = (("encoder self-attention", 64, 64, False, False), ("decoder causal self-attention", 40, 40, True, False),
          ("decoder cross-attention", 40, 64, False, True))  # (name, Q, K, causal, cross)


def block_costs(shape, Q: int, K: int, causal: bool, cross: bool, attention: str) -> list[dict]:
  """The compiler's cost of one `Attention` block over dense_base's per-chip rows, forward and forward + backward;
  `shape(shape, dtype)` gives an abstract array on the chip."""
  import jax
  import jax.numpy as jnp

  from gshard_mt.model import layers
  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  B, M, A, D = 128, 512, 8, 64
  x, kv = shape((B, Q, M), jnp.bfloat16), shape((B, K, M), jnp.bfloat16)
  ids = shape((B, Q), jnp.int32), shape((B, K), jnp.int32)
  module = layers.Attention(num_heads=A, head_dim=D, dtype=jnp.bfloat16, is_cross=cross, attention=attention,
                            causal=causal)

  norm = shape((M,), jnp.float32), shape((M,), jnp.float32)  # the layer norm's scale and bias

  def call(apply, x, kv, norm, qs, ks):  # the module's init or apply on one block's inputs
    return apply(x, kv if cross else None, layers.packing_mask(qs, ks, causal, attention), norm=norm,
                 deterministic=True)

  forward = lambda params, *a: call(functools.partial(module.apply, params), *a)  # noqa: E731
  params = jax.eval_shape(lambda *a: call(functools.partial(module.init, jax.random.key(0)), *a), x, kv, norm, *ids)
  params = jax.tree.map(lambda a: shape(a.shape, a.dtype), params)
  loss = lambda *a: jnp.sum(forward(*a).astype(jnp.float32) ** 2)  # noqa: E731
  grad = jax.grad(loss, (0, 1, 2, 3) if cross else (0, 1, 3))
  return [tpu.compiler_cost(jax.jit(f).lower(params, x, kv, norm, *ids).compile()) for f in (forward, grad)]


def main(argv):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--topology", default="v5p:2x2x1")
  args = p.parse_args(argv)
  import jax

  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  _, sharding = tpu.one_chip(args.topology)
  shape = lambda s, dtype: jax.ShapeDtypeStruct(s, dtype, sharding=sharding)  # noqa: E731
  us = lambda c: f"{c['optimal_seconds'] * 1e6:.0f} us"  # noqa: E731
  print("| attention block, forward + backward | einsums ('xla') | Pallas ('pallas') | bytes xla / pallas | "
        "forward only, xla / pallas |")
  print("|---|---|---|---|---|")
  for name, Q, K, causal, cross in BLOCKS:
    (xf, xb), (pf, pb) = (block_costs(shape, Q, K, causal, cross, a) for a in ("xla", "pallas"))
    print(f"| {name} ({Q} x {K}) | {us(xb)} | {us(pb)} ({pb['optimal_seconds'] / xb['optimal_seconds']:.2f}x) | "
          f"{xb['bytes accessed'] / 2**20:.0f} / {pb['bytes accessed'] / 2**20:.0f} MiB | {us(xf)} / {us(pf)} |",
          flush=True)


if __name__ == "__main__":
  cli.run(main)

"""Where the TPU estimate's unattributed time lives: the compiler's estimate (not a measurement) of each piece of
configs/dense_base.py's layers on its per-chip batch (128 rows of 64 source / 40 target positions, M=512, FFN
3072, 8 heads of 64, V=16,000; bf16 compute, float32 weights), forward + backward, against the per-instruction roofline
(`gshard_mt.tpu.estimates.roofline`: FLOPs at the compiler's peak, bytes at its bandwidth). The difference is what the
compiler charges beyond FLOPs and bytes, the "unattributed" of bench/step_breakdown.py.

  python bench/step_pieces.py [--topology v5p:2x2x1]

Then three tables of the compiler's charge away from any other work: a chain of matmuls at the step's widths (its
FLOP/s against the compiler's own peak), row sums over M at the step's row counts, read in float32 or bf16
(against their bytes at the compiler's bandwidth), and one of the model's encoder layers in a chain (the goal's
options: dropout 0, bf16 residual, Pallas attention), also with its FFN all but removed and with one head.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gshard_mt import cli  # noqa: E402

CONFIG, CHIPS = "configs/dense_base.py", 4  # its batch over v5p:2x2x1's chips (data=4)


def dense_base():
  return cli.load(ROOT / CONFIG)


def pieces(jnp, jax):
  """{name: (function, argument shapes and dtypes)} of the step's pieces, each differentiated where it trains, at
  CONFIG's shapes on one of CHIPS chips."""
  from gshard_mt.kernels.attention import pallas_attention

  c = dense_base()
  B, L, T, M, F = c.batch_size // CHIPS, c.data.max_length, c.data.max_target_length, c.model.emb_dim, c.model.mlp_dim
  A, D, V = c.model.num_heads, c.model.head_dim, c.data.vocab_size

  bf16, f32 = jnp.bfloat16, jnp.float32

  def project(x, w):  # BLM,MF->BLF
    return jnp.einsum("BLM,MF->BLF", x, w.astype(x.dtype))

  def ffn(x, wi, wo):
    return project(jax.nn.relu(project(x, wi)), wo)

  def layer_norm(x, scale, bias):  # float32 residual in, bf16 out
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return ((x - mean) * jax.lax.rsqrt(var + 1e-6) * scale + bias).astype(bf16)

  def logits_nll(x, w, targets):
    log_probs = jax.nn.log_softmax(project(x, w).astype(f32))
    return -jnp.take_along_axis(log_probs, targets[..., None], -1)

  def three_projections(x, wq, wk, wv):
    return jnp.concatenate([project(x, wq), project(x, wk), project(x, wv)], -1)

  def attention_block(x, scale, bias, wq, wk, wv, wo, segments):
    return pallas_attention(x, None, (scale, bias), (wq, wk, wv, wo), segments, segments, causal=False, dtype=bf16)

  return {
      f"dense FFN (M -> {F} -> M)": (ffn, [((B, L, M), bf16), ((M, F), f32), ((F, M), f32)]),
      "one attention projection (M -> A·D)": (project, [((B, L, M), bf16), ((M, A * D), f32)]),
      "the same, bf16 weight (no cast)": (project, [((B, L, M), bf16), ((M, A * D), bf16)]),
      "three projections (q, k, v)": (three_projections, [((B, L, M), bf16)] + [((M, A * D), f32)] * 3),
      "one projection to 3·A·D (q, k, v fused)": (project, [((B, L, M), bf16), ((M, 3 * A * D), f32)]),
      "layer norm": (layer_norm, [((B, L, M), f32), ((M,), f32), ((M,), f32)]),
      f"logits and log-softmax ({T} positions, V={V})": (logits_nll, [((B, T, M), bf16), ((M, V), f32),
                                                                       ((B, T), jnp.int32)]),
      "Pallas attention block (layer norm, projections, core, output)": (
          attention_block, [((B, L, M), bf16), ((M,), f32), ((M,), f32)] + [((M, A, D), f32)] * 3
          + [((A, D, M), f32), ((B, L), jnp.int32)]),
  }


def matmul_chains(jnp, rows: int, widths, length: int = 8):
  """{(K, N): (function, shapes, FLOPs)}: `length` matmuls of [rows, K] by [K, N] weights in a chain (N -> K by the
  transpose when K != N), each weight offset by its index so that no two are the same: the compiler's charge per
  matmul at the step's widths, away from any other work."""
  bf16 = jnp.bfloat16

  def chain(x, w):
    for i in range(length):
      x = x @ ((w + i) if i % 2 == 0 or w.shape[0] == w.shape[1] else (w + i).T)
    return x

  return {(K, N): (chain, [((rows, K), bf16), ((K, N), bf16)], 2 * rows * K * N * length) for K, N in widths}


def row_sums(jnp, M: int, rows_list) -> dict:
  """{(rows, dtype name): (function, shapes, bytes read)}: the sum over M of each row of [rows, M], read in the
  given dtype and summed in float32, as a layer norm's statistics or the loss's reductions are."""
  def row_sum(x):
    return jnp.sum(x.astype(jnp.float32), axis=-1)

  return {(rows, jnp.dtype(dtype).name): (row_sum, [((rows, M), dtype)], rows * M * jnp.dtype(dtype).itemsize)
          for rows in rows_list for dtype in (jnp.float32, jnp.bfloat16)}


# (label, config overrides) of the encoder layers chained by `layer_chain`: the options the goal's estimate uses, then
# the same with the FFN all but removed and with attention narrowed to one head of 64 (A·D 512 -> 64).
LAYER_VARIANTS = (("dense_base's encoder layer", {}), ("FFN hidden 3072 -> 128", {"model.mlp_dim": "128"}),
                  ("attention 8 heads -> 1", {"model.num_heads": "1"}))
LAYER_OPTIONS = {"model.dropout_rate": "0.0", "model.residual_dtype": "bfloat16", "model.attention": "pallas"}


def layer_chain(jax, jnp, overrides: dict, n: int):
  """(function, argument shapes) of the gradient through n of the model's own encoder layers (`Layer`) in a chain,
  on dense_base's per-chip source rows with LAYER_OPTIONS and `overrides`: a layer's charge in steady state is the
  difference between two chain lengths."""
  import dataclasses

  import flax.linen as nn

  from gshard_mt.kernels import seam
  from gshard_mt.model.transformer import Layer, LayerInputs, TransformerConfig, packing_mask

  c = cli.load(ROOT / CONFIG, {**LAYER_OPTIONS, **overrides})
  cfg = TransformerConfig.from_config(c, c.data.vocab_size)
  cfg = dataclasses.replace(cfg, ops=seam.pick(c, cfg, jax.devices()[0]))  # the kernels, as the training setup
  B, L = c.batch_size // CHIPS, c.data.max_length

  class Chain(nn.Module):
    @nn.compact
    def __call__(self, x, segments):
      inputs = LayerInputs(packing_mask(segments, segments, False, cfg.model.attention, cfg.ops.attention is not None),
                           segments > 0)
      for i in range(n):
        x, _ = Layer(cfg, is_decoder=False, use_moe=False, name=f"layer_{i}")(x, inputs, deterministic=True)
      return x

  x, segments = jnp.zeros((B, L, cfg.model.emb_dim), cfg.residual_dtype), jnp.ones((B, L), jnp.int32)
  params = jax.eval_shape(lambda: nn.unbox(Chain().init(jax.random.key(0), x, segments)))
  shapes = [jax.tree.map(lambda a: (a.shape, a.dtype), params), ((B, L, cfg.model.emb_dim), cfg.residual_dtype),
            ((B, L), jnp.int32)]
  grad = jax.grad(lambda p, x, s: jnp.sum(Chain().apply(p, x, s).astype(jnp.float32) ** 2), argnums=(0, 1))
  return grad, shapes


def forward_backward(jax, jnp, fn, shapes):
  """The gradient of sum(fn(...)^2) with respect to fn's floating-point arguments: one piece's training work."""
  floating = tuple(i for i, (_, dtype) in enumerate(shapes) if jnp.issubdtype(dtype, jnp.floating))
  return jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32) ** 2), argnums=floating)


def abstract(jax, shapes, sharding) -> list:
  """ShapeDtypeStructs on `sharding` for (shape, dtype) pairs, or trees of them."""
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(*s, sharding=sharding), shapes,
                      is_leaf=lambda s: isinstance(s, tuple) and len(s) == 2 and isinstance(s[0], tuple))


def main(argv):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--topology", default="v5p:2x2x1")
  args = p.parse_args(argv)
  import jax
  import jax.numpy as jnp

  from gshard_mt.tpu.estimates import roofline
  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  device, sharding = tpu.one_chip(args.topology)
  print("| piece, forward + backward | compiler's optimal_seconds | per-instruction roofline | unattributed |")
  print("|---|---|---|---|")
  for name, (fn, shapes) in pieces(jnp, jax).items():
    compiled = jax.jit(forward_backward(jax, jnp, fn, shapes)).lower(*abstract(jax, shapes, sharding)).compile()
    total, attributed = roofline.estimate_and_attributed(compiled, device)
    print(f"| {name} | {total * 1e6:.0f} us | {attributed * 1e6:.0f} us | {(total - attributed) * 1e6:.0f} us |",
          flush=True)
  peak, bandwidth = roofline.compiler_roofline(device)
  c = dense_base()
  rows, M, F, V = c.batch_size // CHIPS * c.data.max_length, c.model.emb_dim, c.model.mlp_dim, c.data.vocab_size
  print(f"\n| a chain of 8 matmuls of {rows} rows, K x N | compiler's charge per matmul | its FLOP/s | of its peak |")
  print("|---|---|---|---|")
  chains = [(f"{K} x {N}", 8, chain) for (K, N), chain in matmul_chains(jnp, rows, [(M, M), (M, F), (M, V)]).items()]
  chains.append((f"{M} x {M}, one matmul alone", 1, matmul_chains(jnp, rows, [(M, M)], length=1)[(M, M)]))
  for label, length, (fn, shapes, flops) in chains:
    total = tpu.compiler_cost(jax.jit(fn).lower(*abstract(jax, shapes, sharding)).compile())["optimal_seconds"]
    print(f"| {label} | {total / length * 1e6:.1f} us | {flops / total / 1e12:.0f} T | {flops / total / peak:.0%} |",
          flush=True)
  print(f"\n| row sums over M={M}: rows, dtype read | compiler's charge | its bytes at the bandwidth |\n|---|---|---|")
  for (n, dtype), (fn, shapes, nbytes) in row_sums(jnp, M, [c.batch_size // CHIPS * c.data.max_target_length,
                                                           rows, 4 * rows]).items():
    total = tpu.compiler_cost(jax.jit(fn).lower(*abstract(jax, shapes, sharding)).compile())["optimal_seconds"]
    print(f"| {n}, {dtype} | {total * 1e6:.1f} us | {nbytes / bandwidth * 1e6:.1f} us |", flush=True)
  print("\n| one layer of a chain, forward + backward (4 layers less 2, over 2) | compiler's charge | per-instruction "
        "roofline | unattributed |\n|---|---|---|---|")
  for label, overrides in LAYER_VARIANTS:
    costs = []
    for n in (2, 4):
      fn, shapes = layer_chain(jax, jnp, overrides, n)
      costs.append(roofline.estimate_and_attributed(jax.jit(fn).lower(*abstract(jax, shapes, sharding)).compile(),
                                                    device))
    total, attributed = ((four - two) / 2 for two, four in zip(*costs))
    print(f"| {label} | {total * 1e3:.3f} ms | {attributed * 1e3:.3f} ms | {(total - attributed) * 1e3:.3f} ms |",
          flush=True)


if __name__ == "__main__":
  cli.run(main)

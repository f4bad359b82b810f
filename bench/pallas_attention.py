"""What a Pallas attention kernel over our short rows would be charged by the TPU compiler's estimate (an estimate,
not a measurement): the step before building one into the model (issue 25).

  python bench/pallas_attention.py [--topology v5p:2x2x1]

The kernels: forward and backward of one attention core (QK^T, the packing mask from segment ids, softmax, PV;
the backward recomputes the scores) for blocks of 8 rows, each 64-position row's scores whole in VMEM (no online
softmax at this length). q, k, v are read lane-dense, [B, L, A·D] with A·D = 512, as the projections write them,
each head's 64 columns taken inside the kernel: read per head ([.., L, D] blocks, D = 64) they cost relayout copies
about as large as the einsums' own bytes (bench/RESULTS.md). Each declares its cost (`pl.CostEstimate`): the FLOPs
of its matmuls (2 forward, 5 backward) and the bytes of its operands and outputs. First checked in Pallas's
interpret mode against the einsum reference on the CPU (outputs and gradients, float32); then compiled, forward and
forward + backward, for dense_base's per-chip encoder self-attention (128 rows x 64 tokens, 8 heads of 64, bf16)
on the compile-only devices of --topology, beside the model's einsums (`gshard_mt.model.layers`).
"""

from __future__ import annotations

import argparse
import functools

from gshard_mt import cli

ROWS, HEADS, HEAD_DIM = 8, 8, 64  # rows per kernel block; dense_base's heads


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

  A, D = HEADS, HEAD_DIM
  nt = (((1,), (1,)), ((), ()))  # x y^T
  tn = (((0,), (0,)), ((), ()))  # x^T y

  def probs_of(q, k, mask):  # q [L, D], k [K, D] -> float32 softmax [L, K]
    s = jax.lax.dot_general(q, k, nt, preferred_element_type=jnp.float32)
    return jax.nn.softmax(jnp.where(mask, s, layers.NEG_INF), -1)

  def heads(ref, r, a):
    return ref[r, :, a * D:(a + 1) * D]

  def forward_kernel(q_ref, k_ref, v_ref, qs_ref, ks_ref, o_ref):  # [ROWS, L, A*D]; segment ids [ROWS, L]
    for r in range(ROWS):
      mask = (qs_ref[r][:, None] == ks_ref[r][None, :]) & (ks_ref[r][None, :] > 0)
      out = [jnp.dot(probs_of(heads(q_ref, r, a), heads(k_ref, r, a), mask).astype(v_ref.dtype), heads(v_ref, r, a),
                     preferred_element_type=jnp.float32) for a in range(A)]
      o_ref[r] = jnp.concatenate(out, -1).astype(o_ref.dtype)

  def backward_kernel(q_ref, k_ref, v_ref, do_ref, qs_ref, ks_ref, dq_ref, dk_ref, dv_ref):
    for r in range(ROWS):
      mask = (qs_ref[r][:, None] == ks_ref[r][None, :]) & (ks_ref[r][None, :] > 0)
      dq, dk, dv = [], [], []
      for a in range(A):
        q, k, v, do = (heads(ref, r, a) for ref in (q_ref, k_ref, v_ref, do_ref))
        probs = probs_of(q, k, mask)
        dv.append(jax.lax.dot_general(probs.astype(do.dtype), do, tn, preferred_element_type=jnp.float32))
        dp = jax.lax.dot_general(do, v, nt, preferred_element_type=jnp.float32)
        ds = (probs * (dp - jnp.sum(dp * probs, -1, keepdims=True))).astype(q.dtype)
        dq.append(jnp.dot(ds, k, preferred_element_type=jnp.float32))
        dk.append(jax.lax.dot_general(ds, q, tn, preferred_element_type=jnp.float32))
      for ref, parts in ((dq_ref, dq), (dk_ref, dk), (dv_ref, dv)):
        ref[r] = jnp.concatenate(parts, -1).astype(ref.dtype)

  def call(kernel, arrays, segments, outputs, matmuls, interpret):
    B, L, AD = arrays[0].shape
    block, ids = pl.BlockSpec((ROWS, L, AD), lambda b: (b, 0, 0)), pl.BlockSpec((ROWS, L), lambda b: (b, 0))
    nbytes = sum(x.size * x.dtype.itemsize for x in arrays) + outputs * arrays[0].size * arrays[0].dtype.itemsize
    cost = pl.CostEstimate(flops=2 * matmuls * B * A * L * L * D, transcendentals=B * A * L * L,
                           bytes_accessed=nbytes + 2 * segments.size * segments.dtype.itemsize)
    return pl.pallas_call(kernel, grid=(B // ROWS,), in_specs=[block] * len(arrays) + [ids, ids],
                          out_specs=[block] * outputs, cost_estimate=cost, interpret=interpret,
                          out_shape=[jax.ShapeDtypeStruct(arrays[0].shape, arrays[0].dtype)] * outputs)(
                              *arrays, segments, segments)

  @functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
  def pallas_core(q, k, v, segments, interpret=False):  # q, k, v [B, L, A*D], segments [B, L]
    return call(forward_kernel, (q, k, v), segments, 1, 2, interpret)[0]

  def pallas_forward(q, k, v, segments, interpret):
    return pallas_core(q, k, v, segments, interpret), (q, k, v, segments)

  def pallas_backward(interpret, residuals, do):
    q, k, v, segments = residuals
    return (*call(backward_kernel, (q, k, v, do), segments, 3, 5, interpret), None)

  pallas_core.defvjp(pallas_forward, pallas_backward)

  def einsum_core(q, k, v, segments):  # the model's 'xla' attention on the same layout
    B, L, _ = q.shape
    split = lambda x: x.reshape(B, L, A, D)  # noqa: E731
    probs = layers.attention_probs(split(q), split(k), layers.attention_bias(segments, segments, causal=False))
    return jnp.einsum("BAQK,BKAD->BQAD", probs.astype(v.dtype), split(v)).reshape(B, L, A * D)

  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(16, 64, A * D)) * scale, jnp.float32) for scale in (D**-0.5, 1, 1))
  segments = jnp.asarray(np.minimum(np.arange(64) // 20 + 1, 3)[None].repeat(16, 0) * (np.arange(64) < 60), jnp.int32)
  real = (segments > 0)[..., None]
  cotangent = jnp.asarray(rng.normal(size=q.shape), jnp.float32) * real  # padding queries: nothing reads them

  def loss(core, *qkv):
    return jnp.sum(core(*qkv, segments).astype(jnp.float32) * cotangent)

  got = jax.grad(lambda *qkv: loss(lambda *a: pallas_core(*a, True), *qkv), (0, 1, 2))(q, k, v)
  want = jax.grad(functools.partial(loss, einsum_core), (0, 1, 2))(q, k, v)
  errors = [float(jnp.max(jnp.abs(pallas_core(q, k, v, segments, True) - einsum_core(q, k, v, segments)) * real))]
  errors += [float(jnp.max(jnp.abs(g - w)) / jnp.max(jnp.abs(w))) for g, w in zip(got, want)]
  print("interpret mode against the einsums, float32: max |output difference| on real positions "
        f"{errors[0]:.2g}; dq, dk, dv relative {', '.join(f'{e:.2g}' for e in errors[1:])}")
  if max(errors) > 1e-4:
    raise SystemExit("the kernels disagree with the reference")

  sharding = jax.sharding.SingleDeviceSharding(tpu.topology_devices(args.topology)[0])
  qkv = jax.ShapeDtypeStruct((128, 64, A * D), jnp.bfloat16, sharding=sharding)
  ids = jax.ShapeDtypeStruct((128, 64), jnp.int32, sharding=sharding)
  print("\n| one attention core, 128 rows x 64, bf16 | forward | forward + backward | bytes it counts (f + b) |")
  print("|---|---|---|---|")
  for name, core in (("einsums (model.attention='xla')", einsum_core), ("Pallas kernels, lane-dense", pallas_core)):
    forward = tpu.compiler_cost(jax.jit(core).lower(qkv, qkv, qkv, ids).compile())
    grad = jax.grad(lambda q, k, v, s, c=core: jnp.sum(c(q, k, v, s).astype(jnp.float32) ** 2), (0, 1, 2))
    both = tpu.compiler_cost(jax.jit(grad).lower(qkv, qkv, qkv, ids).compile())
    print(f"| {name} | {forward['optimal_seconds'] * 1e6:.0f} us | {both['optimal_seconds'] * 1e6:.0f} us | "
          f"{both['bytes accessed'] / 2**20:.0f} MiB |", flush=True)


if __name__ == "__main__":
  cli.run(main, prog="python bench/pallas_attention.py")

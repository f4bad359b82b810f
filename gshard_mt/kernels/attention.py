"""model.attention='pallas': the whole attention block of packed rows (the layer norm before it, the q, k, v
projections, the attention core and the output projection) as Pallas kernels for TPUs, forward and a backward
that recomputes it; the packing mask built inside from the segment ids.

One kernel per direction, so that neither the normalized rows nor any [B, L, A·D] tensor (q, k, v, the core's
output, or their cotangents) goes through HBM: a block of rows is normalized, projected, attended and projected
back in VMEM, the weights staying there over the grid, in as many rows as the TPU's VMEM holds (`pallas_vmem`;
docs/decisions.md). Our rows are short (64 source,
40 target positions), so each row's scores [Q, K] fit whole: no online softmax. Activations are read as 2-D
[B·L, M] blocks; each head's D columns are taken inside. The backward accumulates the gradients of the weights
and of the norm's scale and bias over its grid in float32, one partial per TensorCore (the grid's first, parallel
dimension).

Each kernel declares its cost (`pl.CostEstimate`): its matmuls' FLOPs and its operands' and outputs' bytes,
which the TPU compiler's estimate charges (a kernel that declares none is charged nothing). On a mesh the kernels
run per device under `shard_map` over the batch's mesh axes, the weights whole on every device and their
gradients summed over those axes; off a TPU they run in Pallas's interpret mode (for tests: slow, not for
training). Letters as in `layers`: B rows, Q, K positions, M model dim, A heads, D head dim; no attention dropout.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from gshard_mt.kernels import vmem as pallas_vmem
from gshard_mt.kernels.pallas import NT, TN, dot, on_tpu
from gshard_mt.model.layers import NEG_INF, attention_mask, norm_terms

# Matmuls of an [rows, M] x [M, A·D] projection, per query row and per key row, and of a row's [Q, K] x D head
# matmuls, per kernel. Forward: q, output | k, v | scores, probs x v. Backward, all recomputed: q, do, dwo, dwq, dq
# | k, v, dwk, dwv, dk, dv | scores, probs x v (for dwo), dv, dp, dq, dk.
FORWARD_MATMULS = (2, 2, 2)
BACKWARD_MATMULS = (5, 6, 6)


def _attend(q, k, qs_ref, ks_ref, heads: int, causal: bool, each):
  """q [R·Q, A·D] (scaled), k [R·K, A·D] -> calls each(rows of Q, rows of K, columns of a head, probs
  [Q, K] float32) for every row and head."""
  R, _, Q = qs_ref.shape
  K = ks_ref.shape[2]
  D = q.shape[1] // heads
  for r in range(R):
    mask = attention_mask(qs_ref[r], ks_ref[r], causal)[0, 0]  # [Q, K]
    qr, kr = slice(r * Q, (r + 1) * Q), slice(r * K, (r + 1) * K)
    for a in range(heads):
      cols = slice(a * D, (a + 1) * D)
      scores = dot(q[qr, cols], k[kr, cols], NT)
      each(qr, kr, cols, jax.nn.softmax(jnp.where(mask, scores, NEG_INF), -1))


def _normalize(x, scale, bias):
  """The layer norm before attention, as `layers.normalize` computes it: x [R·Q, M] (any float dtype), scale,
  bias [1, M] -> (float32 output, x̂ = (x - mean) / std, 1 / std [R·Q, 1])."""
  centered, inv = norm_terms(x)
  return centered * (inv * scale) + bias, centered * inv, inv


def _project(xq, xk, weights, heads: int):
  """xq [R·Q, M], xk [R·K, M] and the weight refs, all in the computation dtype -> q (scaled by D^-1/2), k, v,
  and the four weights."""
  dt = xq.dtype
  wq, wk, wv, wo = (w[...] for w in weights)
  scale = (wq.shape[1] // heads) ** -0.5
  q, k, v = (dot(xq, wq) * scale).astype(dt), dot(xk, wk).astype(dt), dot(xk, wv).astype(dt)
  return q, k, v, (wq, wk, wv, wo), scale


def _inputs(refs, shared: bool):
  """(x ref, kv ref or None, the rest) of a kernel's refs: x alone for self-attention."""
  return (refs[0], None, refs[1:]) if shared else (refs[0], refs[1], refs[2:])


def _forward_kernel(*refs, heads: int, causal: bool, shared: bool):
  """x [R·Q, M] (the residual stream) and, for cross-attention, kv [R·K, M]; wq, wk, wv [M, A·D], wo [A·D, M];
  the layer norm's scale, bias [1, M]; segment ids [R, 1, Q], [R, 1, K] -> y [R·Q, M]; scratch o [R·Q, A·D]
  float32."""
  x_ref, kv_ref, refs = _inputs(refs, shared)
  wq_ref, wk_ref, wv_ref, wo_ref, scale_ref, bias_ref, qs_ref, ks_ref, y_ref, o_scr = refs
  xn = _normalize(x_ref[...], scale_ref[...], bias_ref[...])[0].astype(wq_ref.dtype)
  q, k, v, (_, _, _, wo), _ = _project(xn, xn if shared else kv_ref[...], (wq_ref, wk_ref, wv_ref, wo_ref), heads)

  def each(qr, kr, cols, probs):
    o_scr[qr, cols] = dot(probs.astype(v.dtype), v[kr, cols])

  _attend(q, k, qs_ref, ks_ref, heads, causal, each)
  y_ref[...] = dot(o_scr[...].astype(wo.dtype), wo).astype(y_ref.dtype)


def _backward_kernel(*refs, heads: int, causal: bool, shared: bool):
  """The forward's inputs and y's cotangent dy [R·Q, M] -> dx (and dkv) and the gradients of the weights and of
  the layer norm's scale and bias, added into this core's float32 partials [1, M, A·D] ([1, A·D, M] for wo,
  [1, 1, M] for the norm's); scratch o, dq [R·Q, A·D], dk, dv [R·K, A·D] float32."""
  x_ref, kv_ref, refs = _inputs(refs, shared)
  wq_ref, wk_ref, wv_ref, wo_ref, scale_ref, bias_ref, dy_ref, qs_ref, ks_ref, *refs = refs
  dx_refs, partials, (o_scr, dq_scr, dk_scr, dv_scr) = refs[:-10], refs[-10:-4], refs[-4:]
  dwq_ref, dwk_ref, dwv_ref, dwo_ref, dscale_ref, dbias_ref = partials
  scale_row = scale_ref[...]
  xn, x_hat, inv = _normalize(x_ref[...], scale_row, bias_ref[...])
  xn = xn.astype(wq_ref.dtype)
  xk, dy = xn if shared else kv_ref[...], dy_ref[...]
  q, k, v, (wq, wk, wv, wo), scale = _project(xn, xk, (wq_ref, wk_ref, wv_ref, wo_ref), heads)
  do = dot(dy, wo, NT).astype(dy.dtype)  # [R·Q, A·D]

  def each(qr, kr, cols, probs):
    p = probs.astype(v.dtype)
    o_scr[qr, cols] = dot(p, v[kr, cols])
    dv_scr[kr, cols] = dot(p, do[qr, cols], TN)
    dp = dot(do[qr, cols], v[kr, cols], NT)
    ds = (probs * (dp - jnp.sum(dp * probs, -1, keepdims=True))).astype(q.dtype)  # softmax's backward
    dq_scr[qr, cols] = dot(ds, k[kr, cols]) * scale
    dk_scr[kr, cols] = dot(ds, q[qr, cols], TN)

  _attend(q, k, qs_ref, ks_ref, heads, causal, each)

  @pl.when(pl.program_id(1) == 0)
  def _():
    for ref in partials:
      ref[...] = jnp.zeros_like(ref)

  dq, dk, dv = (s[...].astype(xn.dtype) for s in (dq_scr, dk_scr, dv_scr))
  dwo_ref[0] += dot(o_scr[...].astype(dy.dtype), dy, TN)
  dwq_ref[0] += dot(xn, dq, TN)
  dwk_ref[0] += dot(xk, dk, TN)
  dwv_ref[0] += dot(xk, dv, TN)
  dxn, dkv = dot(dq, wq, NT), dot(dk, wk, NT) + dot(dv, wv, NT)
  dxn = dxn + dkv if shared else dxn  # float32 [R·Q, M]: the normalized rows' cotangent
  dscale_ref[0] += jnp.sum(dxn * x_hat, 0, keepdims=True)
  dbias_ref[0] += jnp.sum(dxn, 0, keepdims=True)
  g = dxn * scale_row  # the layer norm's backward
  dx = inv * (g - jnp.mean(g, -1, keepdims=True) - x_hat * jnp.mean(g * x_hat, -1, keepdims=True))
  for ref, d in zip(dx_refs, (dx,) if shared else (dx, dkv)):
    ref[...] = d.astype(ref.dtype)


def _cost(xs, params, q_segments, k_segments, heads: int, matmuls, other_bytes: int) -> pl.CostEstimate:
  """A kernel's declared cost: `matmuls` (per query row, per key row, per row and head: FORWARD_MATMULS) of its
  projections and head matmuls, and the bytes of its inputs and `other_bytes` (its outputs)."""
  (B, _, Q), K = q_segments.shape, k_segments.shape[2]
  M, AD = params[0].shape
  per_q, per_k, per_head = matmuls
  flops = 2 * M * AD * B * (per_q * Q + per_k * K) + 2 * per_head * B * Q * K * AD
  nbytes = sum(x.size * x.dtype.itemsize for x in (*xs, *params, q_segments, k_segments)) + other_bytes
  return pl.CostEstimate(flops=flops, transcendentals=B * heads * Q * K, bytes_accessed=nbytes)


def _cast(params, dtype) -> tuple:
  """The four weights cast to the computation dtype before the kernels (they read half the bytes and hold half
  the VMEM; their gradients stay float32, from the kernel's partials); the layer norm's scale and bias as they
  are."""
  return tuple(w.astype(dtype) for w in params[:4]) + tuple(params[4:])


def _layout(xs, params, q_segments, k_segments, dtype, vmem: int | None):
  """What both kernels start from: (the params `_cast`, (B, Q, K, M, A·D), the rows per block:
  `pallas_vmem.block_rows`, made to divide the batch's B rows)."""
  params = _cast(params, dtype)
  (B, _, Q), K = q_segments.shape, k_segments.shape[2]
  M, AD = params[0].shape
  rows = pallas_vmem.block_rows(Q, K, M, AD, xs[0].dtype.itemsize, jnp.dtype(dtype).itemsize, vmem)
  return params, (B, Q, K, M, AD), math.gcd(B, rows)


def _forward(xs, params, q_segments, k_segments, heads: int, causal: bool, dtype, vmem: int | None):
  """xs: (x [B·Q, M],) or (x [B·Q, M], kv [B·K, M]); params (wq, wk, wv, wo, scale [1, M], bias [1, M]) -> y
  [B·Q, M] in `dtype`."""
  params, (B, Q, K, M, AD), rows = _layout(xs, params, q_segments, k_segments, dtype, vmem)
  rows_of = lambda L: pl.BlockSpec((rows * L, M), lambda b: (b, 0))  # noqa: E731
  whole = lambda a: pl.BlockSpec(a.shape, lambda b: (0, 0))  # noqa: E731
  ids = lambda L: pl.BlockSpec((rows, 1, L), lambda b: (b, 0, 0))  # noqa: E731
  y = jax.ShapeDtypeStruct((B * Q, M), dtype)
  run = lambda interpret: pl.pallas_call(  # noqa: E731
      functools.partial(_forward_kernel, heads=heads, causal=causal, shared=len(xs) == 1), grid=(B // rows,),
      in_specs=[rows_of(Q), rows_of(K)][:len(xs)] + [whole(p) for p in params] + [ids(Q), ids(K)],
      out_specs=rows_of(Q), out_shape=y, scratch_shapes=[pltpu.VMEM((rows * Q, AD), jnp.float32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                           vmem_limit_bytes=pallas_vmem.vmem_budget(vmem)),
      cost_estimate=_cost(xs, params, q_segments, k_segments, heads, FORWARD_MATMULS, y.size * y.dtype.itemsize),
      interpret=interpret)
  return on_tpu(run, *xs, *params, q_segments, k_segments)


def _backward(xs, params, dy, q_segments, k_segments, heads: int, causal: bool, dtype, vmem: int | None):
  """The forward's inputs and dy [B·Q, M] -> (the xs' cotangents, the params' float32 gradients)."""
  params, (B, Q, K, M, AD), rows = _layout(xs, params, q_segments, k_segments, dtype, vmem)
  cores = 2 if (B // rows) % 2 == 0 else 1  # a v5p chip's two TensorCores split the blocks
  per_core = B // rows // cores
  rows_of = lambda L: pl.BlockSpec((rows * L, M), lambda c, i: (c * per_core + i, 0))  # noqa: E731
  ids = lambda L: pl.BlockSpec((rows, 1, L), lambda c, i: (c * per_core + i, 0, 0))  # noqa: E731
  whole = lambda a: pl.BlockSpec(a.shape, lambda c, i: (0, 0))  # noqa: E731
  # one buffer: a core's partial stays in VMEM over its blocks
  partial = lambda a: pl.BlockSpec((1, *a.shape), lambda c, i: (c, 0, 0), pipeline_mode=pl.Buffered(1))  # noqa: E731
  partials = [jax.ShapeDtypeStruct((cores, *p.shape), jnp.float32) for p in params]
  run = lambda interpret: pl.pallas_call(  # noqa: E731
      functools.partial(_backward_kernel, heads=heads, causal=causal, shared=len(xs) == 1), grid=(cores, per_core),
      in_specs=[rows_of(Q), rows_of(K)][:len(xs)] + [whole(p) for p in params] + [rows_of(Q), ids(Q), ids(K)],
      out_specs=[rows_of(Q), rows_of(K)][:len(xs)] + [partial(p) for p in params],
      out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs] + partials,
      scratch_shapes=[pltpu.VMEM((rows * L, AD), jnp.float32) for L in (Q, Q, K, K)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                           vmem_limit_bytes=pallas_vmem.vmem_budget(vmem)),
      cost_estimate=_cost((*xs, dy), params, q_segments, k_segments, heads, BACKWARD_MATMULS,
                          sum(x.nbytes for x in xs) + sum(4 * p.size for p in partials)),
      interpret=interpret)
  grads = on_tpu(run, *xs, *params, dy, q_segments, k_segments)
  return tuple(grads[:len(xs)]), tuple(g.sum(0) for g in grads[len(xs):])


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _block(xs, params, q_segments, k_segments, heads, causal, dtype, vmem):
  return _forward(xs, params, q_segments, k_segments, heads, causal, dtype, vmem)


def _block_forward(xs, params, q_segments, k_segments, heads, causal, dtype, vmem):
  out = _block(xs, params, q_segments, k_segments, heads, causal, dtype, vmem)
  return out, (xs, params, q_segments, k_segments)


def _block_backward(heads, causal, dtype, vmem, residuals, dy):
  xs, params, q_segments, k_segments = residuals
  dxs, dparams = _backward(xs, params, dy, q_segments, k_segments, heads, causal, dtype, vmem)
  return dxs, tuple(d.astype(p.dtype) for d, p in zip(dparams, params)), None, None


_block.defvjp(_block_forward, _block_backward)


def pallas_attention(x, kv, norm, weights, q_segments, k_segments, causal: bool, dtype, vmem: int | None = None):
  """x [B, Q, M] (the residual stream, before the layer norm) attends to kv [B, K, M] (None: to its own
  normalized rows) with norm = the layer norm's (scale, bias) [M] and weights = (wq, wk, wv [M, A, D], wo
  [A, D, M]) (float32; cast to `dtype` for the matmuls), segment ids [B, Q], [B, K] (0 = padding) -> [B, Q, M] in
  `dtype`: what `layers.Attention` computes on its other paths, as Pallas kernels. `vmem`: the TPU's VMEM in
  bytes (None: not known), which sets the rows per block."""
  wq, wk, wv, wo = weights
  (B, Q, M), (_, A, D) = x.shape, wq.shape
  flat = lambda y: y.reshape(-1, M)  # noqa: E731
  xs = (flat(x),) if kv is None else (flat(x), flat(kv.astype(dtype)))
  params = (*(w.reshape(M, A * D) for w in (wq, wk, wv)), wo.reshape(A * D, M), *(n.reshape(1, M) for n in norm))

  def block(xs, params, q_segments, k_segments):
    return _block(xs, params, q_segments, k_segments, A, causal, jnp.dtype(dtype), vmem)

  mesh = jax.sharding.get_abstract_mesh()
  batch = nn.logical_to_mesh_axes(("batch",))[0] if not mesh.empty else None
  if batch is not None:  # each device's rows through the kernels; the params whole, their gradients summed
    rows, whole = jax.sharding.PartitionSpec(batch), jax.sharding.PartitionSpec()
    # check_vma=False: the kernels' outputs vary over the batch's axes as their inputs do, which Pallas cannot
    # infer; shard_map's transpose then sums the params' per-device gradients over those axes.
    block = jax.shard_map(block, mesh=mesh, in_specs=(rows, whole, rows, rows), out_specs=rows, check_vma=False)
  return block(xs, params, q_segments[:, None], k_segments[:, None]).reshape(B, Q, M)

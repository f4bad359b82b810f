"""model.attention='pallas': the whole attention block of packed rows (the q, k, v projections, the attention core
and the output projection) as Pallas kernels for TPUs, forward and a backward that recomputes it; the packing
mask built inside from the segment ids.

One kernel per direction, so that no [B, L, A·D] tensor (q, k, v, the core's output, or their cotangents) goes
through HBM: a block of rows is projected, attended and projected back in VMEM, the weights staying there over
the grid (bench/RESULTS.md, "The whole attention block in one Pallas kernel"). Our rows are short (64 source,
40 target positions), so each row's scores [Q, K] fit whole: no online softmax. Activations are read as 2-D
[B·L, M] blocks; each head's D columns are taken inside. The backward accumulates the weights' gradients over
its grid in float32, one partial per TensorCore (the grid's first, parallel dimension).

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

from gshard_mt.model.layers import NEG_INF, attention_mask

ROWS = (8, 4, 2, 1)  # rows per kernel block, the most that fits (`block_rows`)
VMEM_LIMIT = 48 * 2**20  # the kernels' scoped VMEM at most (the compiler's default is 16 MiB)
SPARE = 0.9  # `vmem_bytes` is within a few per cent of the compiler's figure: a tenth of the VMEM kept spare
_NN = (((1,), (0,)), ((), ()))  # x y
_NT = (((1,), (1,)), ((), ()))  # x y^T
_TN = (((0,), (0,)), ((), ()))  # x^T y
# Matmuls of an [rows, M] x [M, A·D] projection, per query row and per key row, and of a row's [Q, K] x D head
# matmuls, per kernel. Forward: q, output | k, v | scores, probs x v. Backward, all recomputed: q, do, dwo, dwq, dq
# | k, v, dwk, dwv, dk, dv | scores, probs x v (for dwo), dv, dp, dq, dk.
FORWARD_MATMULS = (2, 2, 2)
BACKWARD_MATMULS = (5, 6, 6)


def _dot(x, y, dims=_NN):
  return jax.lax.dot_general(x, y, dims, preferred_element_type=jnp.float32)


def _attend(q, k, v, qs_ref, ks_ref, heads: int, causal: bool, each):
  """q [R·Q, A·D] (scaled), k, v [R·K, A·D] -> calls each(rows of Q, rows of K, columns of a head, probs
  [Q, K] float32) for every row and head."""
  R, _, Q = qs_ref.shape
  K = ks_ref.shape[2]
  D = q.shape[1] // heads
  for r in range(R):
    mask = attention_mask(qs_ref[r], ks_ref[r], causal)[0, 0]  # [Q, K]
    qr, kr = slice(r * Q, (r + 1) * Q), slice(r * K, (r + 1) * K)
    for a in range(heads):
      cols = slice(a * D, (a + 1) * D)
      scores = _dot(q[qr, cols], k[kr, cols], _NT)
      each(qr, kr, cols, jax.nn.softmax(jnp.where(mask, scores, NEG_INF), -1))


def _project(xq, xk, weights, heads: int):
  """xq [R·Q, M], xk [R·K, M], weight refs (in x's dtype) -> q (scaled by D^-1/2), k, v, and the four weights."""
  dt = xq.dtype
  wq, wk, wv, wo = (w[...] for w in weights)
  scale = (wq.shape[1] // heads) ** -0.5
  q, k, v = (_dot(xq, wq) * scale).astype(dt), _dot(xk, wk).astype(dt), _dot(xk, wv).astype(dt)
  return q, k, v, (wq, wk, wv, wo), scale


def _forward_kernel(*refs, heads: int, causal: bool, shared: bool):
  """x [R·Q, M] (self-attention) or xq [R·Q, M], xk [R·K, M]; wq, wk, wv [M, A·D], wo [A·D, M]; segment ids
  [R, Q], [R, K] -> y [R·Q, M]; scratch o [R·Q, A·D] float32."""
  xq_ref, xk_ref, refs = (refs[0], refs[0], refs[1:]) if shared else (refs[0], refs[1], refs[2:])
  *weights, qs_ref, ks_ref, y_ref, o_scr = refs
  q, k, v, (_, _, _, wo), _ = _project(xq_ref[...], xk_ref[...], weights, heads)

  def each(qr, kr, cols, probs):
    o_scr[qr, cols] = _dot(probs.astype(v.dtype), v[kr, cols])

  _attend(q, k, v, qs_ref, ks_ref, heads, causal, each)
  y_ref[...] = _dot(o_scr[...].astype(wo.dtype), wo).astype(y_ref.dtype)


def _backward_kernel(*refs, heads: int, causal: bool, shared: bool):
  """The forward's inputs and y's cotangent dy [R·Q, M] -> dx (or dxq, dxk) and the weights' gradients, added
  into this core's float32 partials [1, M, A·D] ([1, A·D, M] for wo); scratch o, dq [R·Q, A·D], dk, dv [R·K, A·D]
  float32."""
  xq_ref, xk_ref, refs = (refs[0], refs[0], refs[1:]) if shared else (refs[0], refs[1], refs[2:])
  wq_ref, wk_ref, wv_ref, wo_ref, dy_ref, qs_ref, ks_ref, *refs = refs
  dx_refs, (dwq_ref, dwk_ref, dwv_ref, dwo_ref, o_scr, dq_scr, dk_scr, dv_scr) = refs[:-8], refs[-8:]
  xq, xk, dy = xq_ref[...], xk_ref[...], dy_ref[...]
  q, k, v, (wq, wk, wv, wo), scale = _project(xq, xk, (wq_ref, wk_ref, wv_ref, wo_ref), heads)
  do = _dot(dy, wo, _NT).astype(dy.dtype)  # [R·Q, A·D]

  def each(qr, kr, cols, probs):
    p = probs.astype(v.dtype)
    o_scr[qr, cols] = _dot(p, v[kr, cols])
    dv_scr[kr, cols] = _dot(p, do[qr, cols], _TN)
    dp = _dot(do[qr, cols], v[kr, cols], _NT)
    ds = (probs * (dp - jnp.sum(dp * probs, -1, keepdims=True))).astype(q.dtype)  # softmax's backward
    dq_scr[qr, cols] = _dot(ds, k[kr, cols]) * scale
    dk_scr[kr, cols] = _dot(ds, q[qr, cols], _TN)

  _attend(q, k, v, qs_ref, ks_ref, heads, causal, each)

  @pl.when(pl.program_id(1) == 0)
  def _():
    for ref in (dwq_ref, dwk_ref, dwv_ref, dwo_ref):
      ref[...] = jnp.zeros_like(ref)

  dq, dk, dv = (s[...].astype(xq.dtype) for s in (dq_scr, dk_scr, dv_scr))
  dwo_ref[0] += _dot(o_scr[...].astype(dy.dtype), dy, _TN)
  dwq_ref[0] += _dot(xq, dq, _TN)
  dwk_ref[0] += _dot(xk, dk, _TN)
  dwv_ref[0] += _dot(xk, dv, _TN)
  dxq, dxk = _dot(dq, wq, _NT), _dot(dk, wk, _NT) + _dot(dv, wv, _NT)
  for ref, dx in zip(dx_refs, (dxq + dxk,) if shared else (dxq, dxk)):
    ref[...] = dx.astype(ref.dtype)


def _cost(xs, weights, q_segments, k_segments, heads: int, matmuls, other_bytes: int) -> pl.CostEstimate:
  """A kernel's declared cost: `matmuls` (per query row, per key row, per row and head: FORWARD_MATMULS) of its
  projections and head matmuls, and the bytes of its inputs and `other_bytes` (its outputs)."""
  (B, _, Q), K = q_segments.shape, k_segments.shape[2]
  M, AD = weights[0].shape
  per_q, per_k, per_head = matmuls
  flops = 2 * M * AD * B * (per_q * Q + per_k * K) + 2 * per_head * B * Q * K * AD
  nbytes = sum(x.size * x.dtype.itemsize for x in (*xs, *weights, q_segments, k_segments)) + other_bytes
  return pl.CostEstimate(flops=flops, transcendentals=B * heads * Q * K, bytes_accessed=nbytes)


def _in_dtype_of(xs, weights) -> tuple:
  """The weights cast to the activations' dtype before the kernels: they read half the bytes and hold half the
  VMEM; the casts' transposes carry the float32 gradients back."""
  return tuple(w.astype(xs[0].dtype) for w in weights)


def vmem_bytes(rows: int, Q: int, K: int, M: int, AD: int, itemsize: int) -> int:
  """The backward kernel's VMEM (the larger of the two) with blocks of `rows` rows, as its buffers add up: the
  weights and the float32 partials of their gradients, one buffer each; two buffers of each block of x, kv and dy
  in and of dx, dkv out; the float32 scratch o, dq, dk, dv; q, k, v, do and the float32 products they come from.
  The compiler reports a few per cent more (22.2 MiB against 21.0 for dense_base's encoder rows in blocks of 8;
  bench/RESULTS.md), hence SPARE."""
  per_row = 2 * (3 * Q + 2 * K) * M * itemsize + 2 * (Q + K) * AD * (8 + itemsize)
  return 4 * M * AD * (itemsize + 4) + rows * per_row


def vmem_budget(vmem: int | None) -> int:
  """What the kernels may hold in VMEM on a TPU with `vmem` bytes of it (None: not known, VMEM_LIMIT)."""
  return min(vmem or VMEM_LIMIT, VMEM_LIMIT)


def block_rows(Q: int, K: int, M: int, AD: int, itemsize: int, vmem: int | None) -> int:
  """Rows per block: the most of ROWS whose kernels fit `vmem_budget(vmem)`, else 1 (which the training setup
  refuses beforehand: `tpu_problem`)."""
  return next((r for r in ROWS if vmem_bytes(r, Q, K, M, AD, itemsize) <= SPARE * vmem_budget(vmem)), 1)


def tpu_problem(vmem_capacity: int | None, lengths, M: int, AD: int, itemsize: int) -> str | None:
  """Why the kernels would not compile for a TPU with `vmem_capacity` bytes of VMEM (None: a generation they do
  not support) at row lengths `lengths` (source, target), or None."""
  if vmem_capacity is None:
    return "its Mosaic kernels need a TPU v4 or newer"
  if any(L % 8 for L in lengths):
    return f"its kernels need row lengths that are multiples of 8, not {tuple(lengths)}"
  src, tgt = lengths
  need = max(vmem_bytes(block_rows(Q, K, M, AD, itemsize, vmem_capacity), Q, K, M, AD, itemsize)
             for Q, K in ((src, src), (tgt, tgt), (tgt, src)))
  capacity = vmem_budget(vmem_capacity)
  if need > SPARE * capacity:
    return (f"its backward kernel needs {need / 2**20:.1f} MiB of VMEM at M={M}, A·D={AD}, rows of {src}/{tgt}, "
            f"more than the {capacity / 2**20:.0f} MiB it may use here")
  return None


def _rows(B: int, Q: int, K: int, M: int, AD: int, itemsize: int, vmem: int | None) -> int:
  """`block_rows`, made to divide the batch's B rows."""
  return math.gcd(B, block_rows(Q, K, M, AD, itemsize, vmem))


def _forward(xs, weights, q_segments, k_segments, heads: int, causal: bool, vmem: int | None):
  """xs: (x [B·Q, M],) or (xq [B·Q, M], xk [B·K, M]); weights (wq, wk, wv, wo) -> y [B·Q, M]."""
  weights = _in_dtype_of(xs, weights)
  (B, _, Q), K = q_segments.shape, k_segments.shape[2]
  xq = xs[0]
  rows = _rows(B, Q, K, xq.shape[1], weights[0].shape[1], xq.dtype.itemsize, vmem)
  rows_of = lambda L: pl.BlockSpec((rows * L, xq.shape[1]), lambda b: (b, 0))  # noqa: E731
  whole = lambda a: pl.BlockSpec(a.shape, lambda b: (0, 0))  # noqa: E731
  ids = lambda L: pl.BlockSpec((rows, 1, L), lambda b: (b, 0, 0))  # noqa: E731
  run = lambda interpret: pl.pallas_call(  # noqa: E731
      functools.partial(_forward_kernel, heads=heads, causal=causal, shared=len(xs) == 1), grid=(B // rows,),
      in_specs=[rows_of(Q), rows_of(K)][:len(xs)] + [whole(w) for w in weights] + [ids(Q), ids(K)],
      out_specs=rows_of(Q), out_shape=jax.ShapeDtypeStruct(xq.shape, xq.dtype),
      scratch_shapes=[pltpu.VMEM((rows * Q, weights[0].shape[1]), jnp.float32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",), vmem_limit_bytes=vmem_budget(vmem)),
      cost_estimate=_cost(xs, weights, q_segments, k_segments, heads, FORWARD_MATMULS, xq.nbytes),
      interpret=interpret)
  return _on_tpu(run, *xs, *weights, q_segments, k_segments)


def _backward(xs, weights, dy, q_segments, k_segments, heads: int, causal: bool, vmem: int | None):
  """The forward's inputs and dy [B·Q, M] -> (the xs' cotangents, the weights' float32 gradients)."""
  weights = _in_dtype_of(xs, weights)
  (B, _, Q), K = q_segments.shape, k_segments.shape[2]
  M, AD = weights[0].shape
  rows = _rows(B, Q, K, M, AD, xs[0].dtype.itemsize, vmem)
  cores = 2 if (B // rows) % 2 == 0 else 1  # a v5p chip's two TensorCores split the blocks
  per_core = B // rows // cores
  rows_of = lambda L: pl.BlockSpec((rows * L, M), lambda c, i: (c * per_core + i, 0))  # noqa: E731
  ids = lambda L: pl.BlockSpec((rows, 1, L), lambda c, i: (c * per_core + i, 0, 0))  # noqa: E731
  whole = lambda a: pl.BlockSpec(a.shape, lambda c, i: (0, 0))  # noqa: E731
  # one buffer: a core's partial stays in VMEM over its blocks
  partial = lambda a: pl.BlockSpec((1, *a.shape), lambda c, i: (c, 0, 0), pipeline_mode=pl.Buffered(1))  # noqa: E731
  partials = [jax.ShapeDtypeStruct((cores, *w.shape), jnp.float32) for w in weights]
  out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs] + partials
  run = lambda interpret: pl.pallas_call(  # noqa: E731
      functools.partial(_backward_kernel, heads=heads, causal=causal, shared=len(xs) == 1), grid=(cores, per_core),
      in_specs=[rows_of(Q), rows_of(K)][:len(xs)] + [whole(w) for w in weights] + [rows_of(Q), ids(Q), ids(K)],
      out_specs=[rows_of(Q), rows_of(K)][:len(xs)] + [partial(w) for w in weights], out_shape=out_shape,
      scratch_shapes=[pltpu.VMEM((rows * L, AD), jnp.float32) for L in (Q, Q, K, K)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                           vmem_limit_bytes=vmem_budget(vmem)),
      cost_estimate=_cost((*xs, dy), weights, q_segments, k_segments, heads, BACKWARD_MATMULS,
                          sum(x.nbytes for x in xs) + 4 * cores * M * AD * len(weights)),
      interpret=interpret)
  grads = _on_tpu(run, *xs, *weights, dy, q_segments, k_segments)
  return tuple(grads[:len(xs)]), tuple(g.sum(0) for g in grads[len(xs):])


def _on_tpu(run, *args):
  """`run(interpret=False)` compiled for a TPU, Pallas's interpret mode for any other platform: chosen where the
  program is lowered, not by the host's default backend (a TPU program compiled ahead of time on a CPU host gets
  the kernels)."""
  return jax.lax.platform_dependent(*args, tpu=run(False), default=run(True))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _block(xs, weights, q_segments, k_segments, heads, causal, vmem):
  return _forward(xs, weights, q_segments, k_segments, heads, causal, vmem)


def _block_forward(xs, weights, q_segments, k_segments, heads, causal, vmem):
  return _block(xs, weights, q_segments, k_segments, heads, causal, vmem), (xs, weights, q_segments, k_segments)


def _block_backward(heads, causal, vmem, residuals, dy):
  xs, weights, q_segments, k_segments = residuals
  dxs, dws = _backward(xs, weights, dy, q_segments, k_segments, heads, causal, vmem)
  return dxs, tuple(d.astype(w.dtype) for d, w in zip(dws, weights)), None, None


_block.defvjp(_block_forward, _block_backward)


def pallas_attention(x, kv, wq, wk, wv, wo, q_segments, k_segments, causal: bool, vmem: int | None = None):
  """x [B, Q, M] attends to kv [B, K, M] (None: to itself) with weights wq, wk, wv [M, A, D], wo [A, D, M]
  (float32; cast to x's dtype inside) and segment ids [B, Q], [B, K] (0 = padding) -> [B, Q, M]: what the
  'xla' path of `layers.Attention` computes, as Pallas kernels. `vmem`: the TPU's VMEM in bytes (None: not known),
  which sets the rows per block."""
  (B, Q, M), (_, A, D) = x.shape, wq.shape
  flat = lambda y: y.reshape(-1, M)  # noqa: E731
  xs = (flat(x),) if kv is None else (flat(x), flat(kv))
  weights = (*(w.reshape(M, A * D) for w in (wq, wk, wv)), wo.reshape(A * D, M))

  def block(xs, weights, q_segments, k_segments):
    return _block(xs, weights, q_segments, k_segments, A, causal, vmem)

  mesh = jax.sharding.get_abstract_mesh()
  batch = nn.logical_to_mesh_axes(("batch",))[0] if not mesh.empty else None
  if batch is not None:  # each device's rows through the kernels; the weights whole, their gradients summed
    rows, whole = jax.sharding.PartitionSpec(batch), jax.sharding.PartitionSpec()
    # check_vma=False: the kernels' outputs vary over the batch's axes as their inputs do, which Pallas cannot
    # infer; shard_map's transpose then sums the weights' per-device gradients over those axes.
    block = jax.shard_map(block, mesh=mesh, in_specs=(rows, whole, rows, rows), out_specs=rows, check_vma=False)
  return block(xs, weights, q_segments[:, None], k_segments[:, None]).reshape(B, Q, M)

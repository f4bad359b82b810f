"""model.logits='pallas': the logits and what the loss reads of them, as Pallas kernels for TPUs, so that no
[B, L, V] logits go through HBM.

The loss (`training.step.cross_entropy`) reads four numbers per position of the logits z = y W: their
log-sum-exp, the target's logit, their sum (for label smoothing) and their argmax (for accuracy). The forward
kernel computes them over blocks of rows, streaming W in blocks of vocabulary with an online log-sum-exp. The
backward recomputes each block of logits and forms dz = a softmax(z) + b onehot(target) + c from the three
statistics' cotangents a, b, c: one kernel adds dz W^T into dy over the vocabulary blocks, another x^T dz into
dW over the row blocks (each kernel's accumulating dimension is its grid's last; the other is parallel, split
between a v5p chip's two TensorCores).

Each kernel declares its cost (`pl.CostEstimate`): its matmuls' FLOPs and its bytes, W read once per block of
rows (y once per block of vocabulary in the dW kernel). On a mesh the kernels run per device under `shard_map`
over the batch's mesh axes, W whole on every device; off a TPU in Pallas's interpret mode (tests only).
Letters: N rows (B·L positions), M model dim, V vocabulary.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from gshard_mt.model import kernels

ROWS = 1024  # rows per block: W is read N / ROWS times
MAX_VOCAB_BLOCK = 2048  # the largest multiple of 128 up to this that divides V (else V whole) is a vocabulary block
_NN = (((1,), (0,)), ((), ()))
_NT = (((1,), (1,)), ((), ()))
_TN = (((0,), (0,)), ((), ()))


def _dot(x, y, dims=_NN):
  return jax.lax.dot_general(x, y, dims, preferred_element_type=jnp.float32)


def _block_logits(y_ref, w_ref, vocab_block):
  """y [R, M] and W's vocabulary block number `vocab_block` [M, Vb] -> (float32 logits [R, Vb], vocabulary ids)."""
  z = _dot(y_ref[...], w_ref[...].astype(y_ref.dtype))
  return z, jax.lax.broadcasted_iota(jnp.int32, z.shape, 1) + vocab_block * z.shape[1]


def _forward_kernel(y_ref, w_ref, t_ref, out_ref, max_scr, sum_exp_scr, target_scr, sum_scr, arg_scr):
  """y [R, M], W [M, Vb], targets [R, 1] -> [R, 4] float32: log-sum-exp, target logit, logit sum, argmax (written
  after the last vocabulary block; scratch [R, 1] running values)."""
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _():
    max_scr[...] = jnp.full_like(max_scr, -jnp.inf)
    for scr in (sum_exp_scr, target_scr, sum_scr, arg_scr):
      scr[...] = jnp.zeros_like(scr)

  z, ids = _block_logits(y_ref, w_ref, j)
  block_max = jnp.max(z, -1, keepdims=True)
  first_max = jnp.min(jnp.where(z == block_max, ids, jnp.iinfo(jnp.int32).max), -1, keepdims=True)
  old_max = max_scr[...]
  new_max = jnp.maximum(old_max, block_max)
  arg_scr[...] = jnp.where(block_max > old_max, first_max, arg_scr[...])  # ties keep the earlier block's id
  sum_exp_scr[...] = sum_exp_scr[...] * jnp.exp(old_max - new_max) + jnp.sum(jnp.exp(z - new_max), -1, keepdims=True)
  max_scr[...] = new_max
  target_scr[...] += jnp.sum(jnp.where(ids == t_ref[...], z, 0.0), -1, keepdims=True)
  sum_scr[...] += jnp.sum(z, -1, keepdims=True)

  @pl.when(j == pl.num_programs(1) - 1)
  def _():
    lse = max_scr[...] + jnp.log(sum_exp_scr[...])
    out_ref[...] = jnp.concatenate([lse, target_scr[...], sum_scr[...], arg_scr[...].astype(jnp.float32)], -1)


def _dz(y_ref, w_ref, t_ref, g_ref, vocab_block):
  """The logits' cotangent [R, Vb] in y's dtype from g [R, 4]: log-sum-exp, and the cotangents of the log-sum-exp,
  the target logit and the logit sum."""
  z, ids = _block_logits(y_ref, w_ref, vocab_block)
  g = g_ref[...]
  dz = g[:, 1:2] * jnp.exp(z - g[:, 0:1]) + jnp.where(ids == t_ref[...], g[:, 2:3], 0.0) + g[:, 3:4]
  return dz.astype(y_ref.dtype)


def _dy_kernel(y_ref, w_ref, t_ref, g_ref, dy_ref, acc_scr):
  """Adds dz W^T over the vocabulary blocks (the grid's last dimension) -> dy [R, M]."""
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _():
    acc_scr[...] = jnp.zeros_like(acc_scr)

  acc_scr[...] += _dot(_dz(y_ref, w_ref, t_ref, g_ref, j), w_ref[...].astype(y_ref.dtype), _NT)

  @pl.when(j == pl.num_programs(1) - 1)
  def _():
    dy_ref[...] = acc_scr[...].astype(dy_ref.dtype)


def _dw_kernel(y_ref, w_ref, t_ref, g_ref, dw_ref):
  """Adds y^T dz over the row blocks (the grid's last dimension) into dW's vocabulary block [M, Vb] (float32)."""
  @pl.when(pl.program_id(1) == 0)
  def _():
    dw_ref[...] = jnp.zeros_like(dw_ref)

  dw_ref[...] += _dot(y_ref[...], _dz(y_ref, w_ref, t_ref, g_ref, pl.program_id(0)), _TN)


def vocab_block(V: int) -> int:
  """The vocabulary block: the largest multiple of 128 up to MAX_VOCAB_BLOCK dividing V, else V."""
  return next((b for b in range(MAX_VOCAB_BLOCK, 0, -128) if V % b == 0), V)


def _call(kernel, y, w, targets, extra, out, *, rows_outer: bool, matmuls: int, scratch=()):
  """Runs `kernel` over (row blocks, vocabulary blocks) if rows_outer, else (vocabulary, rows); the last dimension
  accumulates. Inputs y [N, M], W [M, V], targets [N, 1] and `extra` (None, or g [N, 4]); `out` the output's
  (shape, dtype, row-blocked?)."""
  (N, M), V = y.shape, w.shape[1]
  R, Vb = (ROWS if N % ROWS == 0 else N), vocab_block(V)
  grid = (N // R, V // Vb) if rows_outer else (V // Vb, N // R)
  at = (lambda i, j: (i, j)) if rows_outer else (lambda j, i: (i, j))  # (row block, vocabulary block)
  rows_of = lambda width: pl.BlockSpec((R, width), lambda *g: (at(*g)[0], 0))  # noqa: E731
  inputs = [y, w, targets] + ([] if extra is None else [extra])
  in_specs = [rows_of(M), pl.BlockSpec((M, Vb), lambda *g: (0, at(*g)[1])), rows_of(1)] + (
      [] if extra is None else [rows_of(extra.shape[1])])
  shape, dtype, by_rows = out
  out_spec = rows_of(shape[1]) if by_rows else pl.BlockSpec((M, Vb), lambda *g: (0, at(*g)[1]))
  reads = y.nbytes * (1 if rows_outer else V // Vb) + w.nbytes * (N // R if rows_outer else 1)
  nbytes = reads + (targets.nbytes + (0 if extra is None else extra.nbytes)) * (1 if rows_outer else V // Vb)
  cost = pl.CostEstimate(flops=2 * matmuls * N * M * V, transcendentals=N * V,
                         bytes_accessed=nbytes + jnp.dtype(dtype).itemsize * shape[0] * shape[1])
  run = lambda interpret: pl.pallas_call(  # noqa: E731
      kernel, grid=grid, in_specs=in_specs, out_specs=out_spec, out_shape=jax.ShapeDtypeStruct(shape, dtype),
      scratch_shapes=[pltpu.VMEM(s, jnp.float32) for s in scratch],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
      cost_estimate=cost, interpret=interpret)
  return kernels.on_tpu(run, *inputs)


@jax.custom_vjp
def _statistics(y, w, targets):
  """y [N, M], W [M, V], targets [N, 1] -> [N, 4] float32 (log-sum-exp, target logit, logit sum, argmax)."""
  R = ROWS if y.shape[0] % ROWS == 0 else y.shape[0]
  return _call(_forward_kernel, y, w, targets, None, ((y.shape[0], 4), jnp.float32, True), rows_outer=True,
               matmuls=1, scratch=[(R, 1)] * 5)


def _statistics_forward(y, w, targets):
  stats = _statistics(y, w, targets)
  return stats, (y, w, targets, stats[:, 0])


def _statistics_backward(residuals, d_stats):
  y, w, targets, lse = residuals
  g = jnp.concatenate([lse[:, None], d_stats[:, :3]], -1)  # the argmax has no cotangent
  R = ROWS if y.shape[0] % ROWS == 0 else y.shape[0]
  dy = _call(_dy_kernel, y, w, targets, g, (y.shape, y.dtype, True), rows_outer=True, matmuls=2,
             scratch=[(R, y.shape[1])])
  dw = _call(_dw_kernel, y, w, targets, g, (w.shape, jnp.float32, False), rows_outer=False, matmuls=2)
  return dy, dw.astype(w.dtype), None


_statistics.defvjp(_statistics_forward, _statistics_backward)


def logit_statistics(y, w, targets):
  """y [B, L, M] (the decoder's output, in the computation dtype), W [M, V], targets [B, L] int32 -> (log-sum-exp,
  target logit, logit sum: float32 [B, L]; argmax: int32 [B, L]) of the logits y W, which are never written."""
  B, L, M = y.shape
  stats = kernels.per_device(_statistics, (True, False, True))(y.reshape(B * L, M), w, targets.reshape(B * L, 1))
  stats = stats.reshape(B, L, 4)
  return stats[..., 0], stats[..., 1], stats[..., 2], stats[..., 3].astype(jnp.int32)

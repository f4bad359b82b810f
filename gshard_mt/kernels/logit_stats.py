"""What the loss reads from the logits, in one pass over them: per position, the log-sum-exp, the target's logit,
the sum of the logits (for label smoothing) and the argmax (for the accuracy).

XLA reads the [B, L, V] logits (the step's largest tensor) once per reduction, and writes a float32 copy first for
them to read (what each costs: docs/decisions.md). On a TPU `logit_stats` is one Pallas kernel over blocks of rows,
each row's V logits whole in VMEM, read in their own dtype; elsewhere the same reductions in jnp (`reference`),
which the kernel is tested against in interpret mode. The backward, with the log-sum-exp saved, is one jnp pass: the
derivatives of (lse, target logit, sum) in z are (softmax, one-hot, 1).

On a mesh the kernel runs per device under `shard_map` over the batch's mesh axes; where the rules split the
length or the vocabulary, jnp instead. Letters: B rows, L positions, V the vocabulary; N = B·L, T rows per block.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from gshard_mt.kernels import vmem as pallas_vmem
from gshard_mt.kernels.pallas import on_tpu
from gshard_mt.model import loss
from gshard_mt.model.loss import reference

BLOCK_BYTES = 4 << 20  # one [T, V] block in float32: the double-buffered input and the working copies fit VMEM


def _kernel(z_ref, t_ref, lse_ref, target_ref, sum_ref, argmax_ref):
  z = z_ref[...].astype(jnp.float32)  # [T, V]
  m = jnp.max(z, -1, keepdims=True)
  lse_ref[...] = m + jnp.log(jnp.sum(jnp.exp(z - m), -1, keepdims=True))
  column = jax.lax.broadcasted_iota(jnp.int32, z.shape, 1)
  target_ref[...] = jnp.sum(jnp.where(column == t_ref[...], z, 0.0), -1, keepdims=True)
  sum_ref[...] = jnp.sum(z, -1, keepdims=True)
  argmax_ref[...] = jnp.min(jnp.where(z == m, column, z.shape[-1]), -1, keepdims=True)


def _rows_per_block(N: int, V: int) -> int | None:
  """T: a divisor of N, a multiple of 8 (or N itself), with a float32 [T, V] block within BLOCK_BYTES."""
  return pallas_vmem.divisor_rows(N, N, max(1, BLOCK_BYTES // (4 * V)))


def kernel(z: jax.Array, targets: jax.Array, interpret: bool) -> tuple[jax.Array, ...]:
  """`reference`'s results from one Pallas kernel over [T, V] blocks; targets [N, 1] (N must have a
  `_rows_per_block`)."""
  N, V = z.shape
  T = _rows_per_block(N, V)
  rows, column = pl.BlockSpec((T, V), lambda i: (i, 0)), pl.BlockSpec((T, 1), lambda i: (i, 0))
  outs = pl.pallas_call(
      _kernel, grid=(N // T,), in_specs=[rows, column], out_specs=[column] * 4,
      out_shape=[jax.ShapeDtypeStruct((N, 1), jnp.float32)] * 3 + [jax.ShapeDtypeStruct((N, 1), jnp.int32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
      cost_estimate=pl.CostEstimate(flops=8 * N * V, transcendentals=N * V,
                                    bytes_accessed=z.size * z.dtype.itemsize + 4 * N + 16 * N),
      interpret=interpret)(z, targets)
  return tuple(o[:, 0] for o in outs)


def _rows(z, targets):
  """[N, V], [N] -> `reference`'s four [N]: the kernel on a TPU, jnp elsewhere."""
  if _rows_per_block(*z.shape) is None:
    return reference(z, targets)
  return on_tpu(lambda interpret: lambda z, t: kernel(z, t, interpret), z, targets.astype(jnp.int32)[:, None],
                elsewhere=lambda z, t: reference(z, t[:, 0]))


def _forward(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, ...]:
  """logits [B, L, V], targets [B, L] -> `reference`'s four [B, L], the kernel per device on a TPU."""
  V = logits.shape[-1]

  def per_device(z, t):  # rows in (L, B) order, as the TPU lays out the activations ([B, L, V] as [L, B, V])
    stats = _rows(z.transpose(1, 0, 2).reshape(-1, V), t.T.reshape(-1))
    return tuple(s.reshape(t.shape[::-1]).T for s in stats)

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return per_device(logits, targets)
  axes = nn.logical_to_mesh_axes(("batch", "length", "vocab"))
  if any(axes[1:]):  # the length or the vocabulary split: each device would see part of a row
    return reference(logits, targets)
  rows = P(axes[0])  # XLA does not partition Mosaic kernels: per device, even with the rows whole on each
  return jax.shard_map(per_device, mesh=mesh, in_specs=(rows, rows), out_specs=(rows,) * 4,
                       check_vma=False)(logits, targets)


# Differentiable in the logits: the backward is `gshard_mt.model.loss`'s jnp pass over the whole logits, outside any
# shard_map, so that XLA fuses it into the logits' matmuls.
logit_stats = loss.stats_with(_forward)

"""The experts' FFNs on rows in blocks by expert (moe.dispatch='grouped'), by grouped matmuls.

rows [R, M] hold expert 0's rows, then expert 1's, ... (group_sizes [E], summing to R); wi [E, M, H], wo [E, H, M].
`RowLayout` is `ffn.apply_experts`'s layout for them; its `grouped_matmul` has its own backward (a custom VJP), so
no kernel needs a transpose rule: six grouped matmuls in all, x W, x W^T and x^T y (the weight gradients).
`moe.grouped_kernel` picks who computes them (measured in docs/decisions.md):

- 'ragged_dot': `jax.lax.ragged_dot`; on TPU a Mosaic kernel handed the float32 master weights as they are (no cast
  pass over the E matrices), elsewhere the weights cast to the rows' dtype first.
- 'mosaic_gpu': on a Hopper GPU, JAX's Mosaic GPU kernels (`gshard_mt.kernels.mosaic_gpu`, picked by the kernels'
  seam), each block of rows by its own expert only, in one dtype. Elsewhere: 'ragged_dot'.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from gshard_mt.registry import Registry

# lhs [R, X] by each group's rhs [E, X, Y]: [R, Y] (`jax.lax.ragged_dot`'s own).
_RAGGED = jax.lax.RaggedDotDimensionNumbers((([1], [1]), ([], [])), lhs_ragged_dimensions=[0],
                                            rhs_group_dimensions=[0])
# lhs [R, Y] by each group's rhs [E, X, Y] transposed: [R, X] (the input gradients).
_RAGGED_TRANSPOSED = jax.lax.RaggedDotDimensionNumbers((([1], [2]), ([], [])), lhs_ragged_dimensions=[0],
                                                       rhs_group_dimensions=[0])
# lhs [R, X] and rhs [R, Y], contracted over the rows of each group: [E, X, Y] (the weight gradients).
_RAGGED_ROWS = jax.lax.RaggedDotDimensionNumbers((([0], [0]), ([], [])), lhs_ragged_dimensions=[0],
                                                 rhs_group_dimensions=[])


@dataclasses.dataclass(frozen=True)
class RaggedDot:
  """XLA's grouped matmuls (`jax.lax.ragged_dot_general`)."""

  def by_weights(self, x: jax.Array, w: jax.Array, group_sizes: jax.Array, transpose: bool = False) -> jax.Array:
    """x [R, X] by each block's expert weights w [E, X, Y] -> [R, Y] (w [E, Y, X] transposed with `transpose`),
    in x's dtype: the weights as they are on TPU, cast to x's dtype first elsewhere."""
    dims = _RAGGED_TRANSPOSED if transpose else _RAGGED
    as_they_are = lambda: jax.lax.ragged_dot_general(x, w, group_sizes, dims, preferred_element_type=x.dtype)  # noqa: E731
    cast_first = lambda: jax.lax.ragged_dot_general(x, w.astype(x.dtype), group_sizes, dims)  # noqa: E731
    return jax.lax.platform_dependent(tpu=as_they_are, default=cast_first)

  def by_rows(self, x: jax.Array, y: jax.Array, group_sizes: jax.Array, dtype) -> jax.Array:
    """x [R, X] and y [R, Y] contracted over each expert's rows -> [E, X, Y] in `dtype`."""
    return jax.lax.ragged_dot_general(x, y, group_sizes, _RAGGED_ROWS, preferred_element_type=dtype)


# moe.grouped_kernel: who computes the grouped matmuls (the kernels' seam picks 'mosaic_gpu', where it applies)
GROUPED_KERNELS = Registry("moe.grouped_kernel").add({
    "ragged_dot": "XLA's ragged_dot (RaggedDot)",
    "mosaic_gpu": "on a Hopper GPU, JAX's Mosaic GPU kernels (gshard_mt.kernels.mosaic_gpu); elsewhere ragged_dot",
})


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def grouped_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, kernels: Any) -> jax.Array:
  """x [R, X] in blocks by expert (group_sizes [E], summing to R: the Mosaic GPU kernel leaves rows past the
  groups unwritten) by each block's expert weights w [E, X, Y] -> [R, Y] in x's dtype; w's gradient in w's dtype.
  Its own backward, so no kernel needs a transpose rule: x W^T and x^T y (the weight gradient)."""
  return kernels.by_weights(x, w, group_sizes)


def _matmul_forward(x, w, group_sizes, kernels):
  return kernels.by_weights(x, w, group_sizes), (x, w, group_sizes)


def _matmul_backward(kernels, residuals, dy):
  x, w, group_sizes = residuals
  return (kernels.by_weights(dy, w, group_sizes, transpose=True), kernels.by_rows(x, dy, group_sizes, w.dtype),
          None)


grouped_matmul.defvjp(_matmul_forward, _matmul_backward)


@dataclasses.dataclass(frozen=True)
class RowLayout:
  """Rows [R, .] in blocks by expert (`ffn.apply_experts`'s layout for moe.dispatch='grouped'): its matmuls are
  the grouped matmuls of `kernels`."""

  group_sizes: jax.Array  # [E], summing to R
  num_rows: int  # R
  kernels: Any = RaggedDot()  # by_weights and by_rows: XLA's, or a kernel's (`ops.Ops.grouped_matmuls`)

  def up(self, x: jax.Array, wi: jax.Array) -> jax.Array:
    """[R, M] x [E, M, H] -> [R, H]."""
    return grouped_matmul(x, wi, self.group_sizes, self.kernels)

  def down(self, h: jax.Array, wo: jax.Array) -> jax.Array:
    """[R, H] x [E, H, M] -> [R, M]."""
    return grouped_matmul(h, wo, self.group_sizes, self.kernels)

  def per_expert(self, b: jax.Array) -> jax.Array:
    """[E, Y] -> [R, Y]: each row its expert's."""
    return b[jnp.repeat(jnp.arange(b.shape[0]), self.group_sizes, total_repeat_length=self.num_rows)]

  def hidden(self, h: jax.Array) -> jax.Array:
    return h

  def output(self, y: jax.Array) -> jax.Array:
    return y

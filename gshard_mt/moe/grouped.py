"""The experts' FFNs on rows in blocks by expert (moe.dispatch='grouped'), by grouped matmuls.

rows [R, M] hold expert 0's rows, then expert 1's, ... (group_sizes [E], summing to R); wi [E, M, H], wo [E, H, M].
`RowLayout` is `ffn.apply_experts`'s layout for them; its `grouped_matmul` has its own backward (a custom VJP), so
no kernel needs a transpose rule: six grouped matmuls in all, x W, x W^T and x^T y (the weight gradients).
`moe.grouped_kernel` picks who computes them (measured in docs/decisions.md):

- 'ragged_dot': `jax.lax.ragged_dot`; on TPU a Mosaic kernel handed the float32 master weights as they are (no cast
  pass over the E matrices), elsewhere the weights cast to the rows' dtype first.
- 'mosaic_gpu': on a Hopper GPU, JAX's Pallas Mosaic GPU kernels, each block of rows by its own expert only, in one
  dtype (the weights cast to the rows'; the weight gradients rounded to it once). Elsewhere: 'ragged_dot'.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from gshard_mt.config import choices
from gshard_mt.errors import ConfigError

ROW_TILE = 8  # the rows of JAX's Mosaic GPU grouped matmuls, in tiles of 8 (MosaicGpu pads them)
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


@dataclasses.dataclass(frozen=True)
class MosaicGpu:
  """JAX's Mosaic GPU grouped matmuls (Hopper), with their tile sizes; bench/gpu_suite.py times other tiles."""

  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  max_concurrent_steps: int = 4
  grid_block_n: int = 1

  def by_weights(self, x: jax.Array, w: jax.Array, group_sizes: jax.Array, transpose: bool = False) -> jax.Array:
    """As RaggedDot.by_weights; the weights cast to x's dtype first (the kernel takes one dtype)."""
    # optional: JAX's kernel examples, only with moe.grouped_kernel='mosaic_gpu' (they may move between versions)
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu

    R = x.shape[0]
    group_sizes, (x,) = _whole_row_tiles(group_sizes, x)
    return ragged_dot_mgpu.ragged_dot(x, w.astype(x.dtype), group_sizes=group_sizes, transpose_rhs=transpose,
                                      **dataclasses.asdict(self))[:R]

  def by_rows(self, x: jax.Array, y: jax.Array, group_sizes: jax.Array, dtype) -> jax.Array:
    """As RaggedDot.by_rows; the kernel writes x's dtype, cast to `dtype` after."""
    from jax.experimental.pallas.ops.gpu import transposed_ragged_dot_mgpu  # optional: as in `by_weights`

    group_sizes, (x, y) = _whole_row_tiles(group_sizes, x, y)
    return transposed_ragged_dot_mgpu.transposed_ragged_dot(x, y, group_sizes=group_sizes,
                                                          **dataclasses.asdict(self)).astype(dtype)

  def check(self, model_dim: int, hidden_dim: int, dtype) -> None:
    """ConfigError unless the kernels can take these shapes: the rows in bf16 or f16, M and H multiples of the
    tiles (each of M and H is a contracted dimension (block_k), an output one (block_n) and the weight-gradient
    kernel's row one (block_m) in some call; the rows R may be any number: they are padded to whole row tiles)."""
    if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
      raise ConfigError(f"moe.grouped_kernel='mosaic_gpu' multiplies bf16 or f16 rows, not {jnp.dtype(dtype).name} "
                        "(model.dtype)")
    step = math.lcm(self.block_m, self.block_n, self.block_k)
    for key, dim in (("model.emb_dim", model_dim), ("moe.hidden_dim", hidden_dim)):
      if dim % step:
        raise ConfigError(f"{key}={dim}: moe.grouped_kernel='mosaic_gpu' needs a multiple of {step} (its tiles)")


# moe.grouped_kernel -> its grouped matmuls
GROUPED_KERNELS = choices.GROUPED_KERNELS.add({"ragged_dot": RaggedDot, "mosaic_gpu": MosaicGpu})


def _whole_row_tiles(group_sizes: jax.Array, *xs: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """Each of xs [R, .] with zero rows appended up to a multiple of ROW_TILE (other row counts fail as the Mosaic
  GPU kernels lower), counted in the last group, where they add nothing to any product."""
  pad = -xs[0].shape[0] % ROW_TILE
  if not pad:
    return group_sizes, xs
  return group_sizes.at[-1].add(pad), tuple(jnp.pad(x, ((0, pad), (0, 0))) for x in xs)


def kernels_for(name: str, model_dim: int, hidden_dim: int, dtype) -> RaggedDot | MosaicGpu:
  """The grouped matmuls of moe.grouped_kernel=`name` on this process's backend: Mosaic GPU's only on a GPU
  (the weight-gradient kernel asks the device for its number of SMs when it is traced, so it cannot be traced
  for a GPU elsewhere)."""
  if name not in GROUPED_KERNELS:
    raise ConfigError(f"moe.grouped_kernel={name!r}: expected one of {GROUPED_KERNELS.names()}")
  if name == "mosaic_gpu" and jax.default_backend() == "gpu":
    _check_hopper()
    kernels = MosaicGpu()
    kernels.check(model_dim, hidden_dim, dtype)
    return kernels
  return RaggedDot()


def _check_hopper() -> None:
  """ConfigError unless the first device is a Hopper GPU: the kernels' warpgroup matmuls (wgmma) are Hopper's."""
  device = jax.devices()[0]
  capability = str(getattr(device, "compute_capability", ""))
  if not capability.startswith("9."):
    raise ConfigError(f"moe.grouped_kernel='mosaic_gpu' needs a Hopper GPU (compute capability 9.x); "
                      f"{device.device_kind} has {capability or 'none'}: use moe.grouped_kernel='ragged_dot'")


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def grouped_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, kernels: RaggedDot | MosaicGpu) -> jax.Array:
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
  kernels: RaggedDot | MosaicGpu = RaggedDot()

  def matmul(self, x: jax.Array, w: jax.Array) -> jax.Array:
    """[R, X] x [E, X, Y] -> [R, Y]."""
    return grouped_matmul(x, w, self.group_sizes, self.kernels)

  def per_expert(self, b: jax.Array) -> jax.Array:
    """[E, Y] -> [R, Y]: each row its expert's."""
    return b[jnp.repeat(jnp.arange(b.shape[0]), self.group_sizes, total_repeat_length=self.num_rows)]

  def hidden(self, h: jax.Array) -> jax.Array:
    return h

  def output(self, y: jax.Array) -> jax.Array:
    return y

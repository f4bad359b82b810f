"""moe.grouped_kernel='mosaic_gpu': on a Hopper GPU, JAX's Mosaic GPU grouped matmuls (its Pallas kernel examples,
which may move between JAX versions), each block of rows by its own expert only, in one dtype (the weights cast to
the rows'; the weight gradients rounded to it once), behind `grouped.RaggedDot`'s interface (by_weights, by_rows)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu, transposed_ragged_dot_mgpu

from gshard_mt.errors import ConfigError

ROW_TILE = 8  # the rows of JAX's Mosaic GPU grouped matmuls, in tiles of 8 (MosaicGpu pads them)


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
    R = x.shape[0]
    group_sizes, (x,) = _whole_row_tiles(group_sizes, x)
    return ragged_dot_mgpu.ragged_dot(x, w.astype(x.dtype), group_sizes=group_sizes, transpose_rhs=transpose,
                                      **dataclasses.asdict(self))[:R]

  def by_rows(self, x: jax.Array, y: jax.Array, group_sizes: jax.Array, dtype) -> jax.Array:
    """As RaggedDot.by_rows; the kernel writes x's dtype, cast to `dtype` after."""
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


def _whole_row_tiles(group_sizes: jax.Array, *xs: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """Each of xs [R, .] with zero rows appended up to a multiple of ROW_TILE (other row counts fail as the Mosaic
  GPU kernels lower), counted in the last group, where they add nothing to any product."""
  pad = -xs[0].shape[0] % ROW_TILE
  if not pad:
    return group_sizes, xs
  return group_sizes.at[-1].add(pad), tuple(jnp.pad(x, ((0, pad), (0, 0))) for x in xs)


def check_hopper(device) -> None:
  """ConfigError unless `device` (a jax.Device) is a Hopper GPU: the kernels' warpgroup matmuls (wgmma) are Hopper's."""
  capability = str(getattr(device, "compute_capability", ""))
  if not capability.startswith("9."):
    raise ConfigError(f"moe.grouped_kernel='mosaic_gpu' needs a Hopper GPU (compute capability 9.x); "
                      f"{device.device_kind} has {capability or 'none'}: use moe.grouped_kernel='ragged_dot'")

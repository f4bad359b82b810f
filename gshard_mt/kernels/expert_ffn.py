"""moe.expert_kernel='pallas': the experts' FFN on their capacity buffers, relu(x wi) wo per expert, as Pallas
kernels for TPUs, one per direction.

What XLA's fusions of the same matmuls are charged for on the TPU estimate, and these kernels are not: the ReLU
mask packed into bits along G inside the first matmul, the float32 weights converted to bf16 inside every matmul
that reads them, and the transposes of the buffers around the all-to-alls (docs/decisions.md).
Here each expert's weights are cast once into VMEM, where they stay over its blocks of rows,
and the hidden activation goes through HBM once: the forward writes h = relu(x wi), from which the backward reads
both the ReLU's mask (h > 0) and dwo's operand. The backward accumulates dwi and dwo in float32 over an expert's
rows, in VMEM.

Each kernel declares its cost (`pl.CostEstimate`): its matmuls' FLOPs (2 forward, 4 backward, 2·R·M·H each per
expert and peer) and the bytes of its operands and outputs, which is what the TPU compiler's estimate charges for
it. On a mesh the kernels run per device under `shard_map`, with the all-to-alls of the experts' mesh axis; H must
be whole on each device. Off a TPU they run in Pallas's interpret mode (for tests). Letters: E experts (E' on one
device), G groups (G' on one device), C capacity, M model dim, H expert hidden dim; P peers along the experts' mesh
axis (1 without one), R = G'·C rows of an expert from each peer, T rows per block.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from gshard_mt.kernels import vmem as pallas_vmem
from gshard_mt.kernels.pallas import NT, TN, dot, on_tpu
from gshard_mt.moe.manual import axes_of

MAX_ROWS = 1024  # rows per block at most: past that a block only holds more VMEM


def vmem_bytes(rows: int, M: int, H: int, itemsize: int) -> int:
  """The backward kernel's VMEM (the larger of the two) with blocks of `rows` rows: the float32 weights and the
  float32 gradients' accumulators, one buffer each, the weights cast to the computation dtype (`itemsize` bytes);
  two buffers of each row block of x, dy, dx and h; the float32 dh and its masked cast."""
  return M * H * (4 * 4 + 2 * itemsize) + rows * (2 * (3 * M + H) * itemsize + H * (4 + itemsize))


def block_rows(R: int, M: int, H: int, itemsize: int, vmem: int | None) -> int | None:
  """Rows per block: the most that divides R, is a multiple of 8 (or all R) and fits `vmem_budget(vmem)`; None
  where even the weights do not fit."""
  budget = pallas_vmem.SPARE * pallas_vmem.vmem_budget(vmem)
  cap = next((t for t in range(min(R, MAX_ROWS), 0, -8) if vmem_bytes(t, M, H, itemsize) <= budget), None)
  return None if cap is None else pallas_vmem.divisor_rows(R, R, cap)


def tpu_problem(vmem_capacity: int | None, M: int, H: int, itemsize: int) -> str | None:
  """Why the kernels would not compile for a TPU with `vmem_capacity` bytes of VMEM (None: a generation they do
  not support) at M and H, or None."""
  if vmem_capacity is None:
    return "its Mosaic kernels need a TPU v4 or newer"
  if block_rows(8, M, H, itemsize, vmem_capacity) is None:
    return (f"it holds each expert's weights and their gradients in VMEM: {vmem_bytes(8, M, H, itemsize) / 2**20:.0f} "
            f"MiB at M={M}, H={H}, more than the {pallas_vmem.vmem_budget(vmem_capacity) / 2**20:.0f} MiB it may use")
  return None


def _first_block():
  """Whether this is an expert's first block of rows (the grid (E', P, R / T) runs an expert's in order)."""
  return (pl.program_id(1) == 0) & (pl.program_id(2) == 0)


def _cast_weights(wi_ref, wo_ref, wi_c, wo_c):
  """Each expert's weights, cast into VMEM at its first block of rows (an expert's row blocks run in order)."""
  @pl.when(_first_block())
  def _():
    wi_c[...] = wi_ref[0].astype(wi_c.dtype)
    wo_c[...] = wo_ref[0].astype(wo_c.dtype)


def _forward_kernel(x_ref, wi_ref, wo_ref, y_ref, h_ref, wi_c, wo_c):
  _cast_weights(wi_ref, wo_ref, wi_c, wo_c)
  h = jnp.maximum(dot(x_ref[0, 0], wi_c[...]), 0).astype(h_ref.dtype)  # [T, H]
  h_ref[0, 0] = h
  y_ref[0, 0] = dot(h, wo_c[...]).astype(y_ref.dtype)  # [T, M]


def _backward_kernel(x_ref, h_ref, dy_ref, wi_ref, wo_ref, dx_ref, dwi_ref, dwo_ref, wi_c, wo_c):
  _cast_weights(wi_ref, wo_ref, wi_c, wo_c)

  @pl.when(_first_block())
  def _():
    dwi_ref[...] = jnp.zeros_like(dwi_ref)
    dwo_ref[...] = jnp.zeros_like(dwo_ref)

  x, h, dy = x_ref[0, 0], h_ref[0, 0], dy_ref[0, 0]
  da = jnp.where(h > 0, dot(dy, wo_c[...], NT), 0).astype(x.dtype)  # [T, H]: the ReLU's backward
  dx_ref[0, 0] = dot(da, wi_c[...], NT).astype(dx_ref.dtype)
  dwo_ref[0] += dot(h, dy, TN)
  dwi_ref[0] += dot(x, da, TN)


def _specs(rows: int):
  """Block specs over the grid (E', P, R / T): a block of T of an expert's rows [1, 1, T, width] of [P, E', R,
  width] (R rows from each of P peers), and an expert's whole [1, a, b] weight or gradient, one buffer (its block
  changes with the expert only)."""
  row_block = lambda width: pl.BlockSpec((1, 1, rows, width), lambda e, p, r: (p, e, r, 0))  # noqa: E731
  expert = lambda a, b: pl.BlockSpec((1, a, b), lambda e, p, r: (e, 0, 0), pipeline_mode=pl.Buffered(1))  # noqa: E731
  return row_block, expert


def _call(kernel, in_specs, out_specs, out_shape, grid, M, H, dtype, vmem, flops, nbytes):
  return lambda interpret: pl.pallas_call(  # noqa: E731
      kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
      scratch_shapes=[pltpu.VMEM((M, H), dtype), pltpu.VMEM((H, M), dtype)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary"),
                                           vmem_limit_bytes=pallas_vmem.vmem_budget(vmem)),
      cost_estimate=pl.CostEstimate(flops=flops, transcendentals=0, bytes_accessed=nbytes), interpret=interpret)


def _layout(x, wi, vmem):
  """x [P, E', R, M], wi [E', M, H] -> (P, E', R, M, H, the grid, the block specs)."""
  (P, E, R, M), H = x.shape, wi.shape[2]
  rows = block_rows(R, M, H, x.dtype.itemsize, vmem) or R  # None only where setup refused the config on a TPU
  return P, E, R, M, H, (E, P, R // rows), _specs(rows)


def _forward(x, wi, wo, vmem):
  """x [P, E', R, M], wi [E', M, H], wo [E', H, M] (float32) -> (y [P, E', R, M], h [P, E', R, H]) in x's
  dtype."""
  P, E, R, M, H, grid, (row_block, expert) = _layout(x, wi, vmem)
  out_shape = [jax.ShapeDtypeStruct((P, E, R, M), x.dtype), jax.ShapeDtypeStruct((P, E, R, H), x.dtype)]
  nbytes = sum(a.nbytes for a in (x, wi, wo)) + sum(s.size * s.dtype.itemsize for s in out_shape)
  run = _call(_forward_kernel, [row_block(M), expert(M, H), expert(H, M)], [row_block(M), row_block(H)], out_shape,
              grid, M, H, x.dtype, vmem, 2 * 2 * P * E * R * M * H, nbytes)
  return tuple(on_tpu(run, x, wi, wo))


def _backward(x, h, dy, wi, wo, vmem):
  """-> (dx [P, E', R, M] in x's dtype, dwi, dwo in float32)."""
  P, E, R, M, H, grid, (row_block, expert) = _layout(x, wi, vmem)
  out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(wi.shape, jnp.float32),
               jax.ShapeDtypeStruct(wo.shape, jnp.float32)]
  nbytes = sum(a.nbytes for a in (x, h, dy, wi, wo)) + sum(s.size * s.dtype.itemsize for s in out_shape)
  run = _call(_backward_kernel, [row_block(M), row_block(H), row_block(M), expert(M, H), expert(H, M)],
              [row_block(M), expert(M, H), expert(H, M)], out_shape, grid, M, H, x.dtype, vmem,
              4 * 2 * P * E * R * M * H, nbytes)
  return tuple(on_tpu(run, x, h, dy, wi, wo))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _ffn(x, wi, wo, vmem):
  return _forward(x, wi, wo, vmem)[0]


def _ffn_forward(x, wi, wo, vmem):
  y, h = _forward(x, wi, wo, vmem)
  return y, (x, h, wi, wo)


def _ffn_backward(vmem, residuals, dy):
  x, h, wi, wo = residuals
  dx, dwi, dwo = _backward(x, h, dy.astype(x.dtype), wi, wo, vmem)
  return dx, dwi.astype(wi.dtype), dwo.astype(wo.dtype)


_ffn.defvjp(_ffn_forward, _ffn_backward)


def expert_ffn(buffers: jax.Array, wi: jax.Array, wo: jax.Array, buffer_axes: tuple, weight_axes: tuple,
               vmem: int | None = None) -> jax.Array:
  """relu(buffers wi) wo per expert: [E, G, C, M] x wi [E, M, H] x wo [E, H, M] (float32; bf16 in the matmuls
  when the buffers are) -> [E, G, C, M] in the buffers' dtype, what `moe.experts.expert_ffn` computes with a ReLU.

  buffer_axes, weight_axes: the logical axes of the buffers, split by groups as the dispatch writes them
  (`moe.axes.EGCM_BY_GROUP`), and of wi (`EMH`). With the experts split over a mesh axis, which must split the
  groups too, the G -> E and E -> G all-to-alls over it happen here: each device sends the slots of each peer's
  experts and keeps what it receives as it arrives, peer-major ([P, E', G'·C, M]), which the kernels read as
  they are (XLA's all-to-all for the EGCM constraint delivers the same and transposes it to [E', P·G', C, M] in
  HBM, and back, forward and backward). `vmem`: the TPU's VMEM in bytes (None: not known), which sets the rows per
  block.
  """
  def per_device(x, wi, wo, axis=None):
    """x [E, G', C, M] (every expert's slots of this device's groups), wi [E', M, H], wo [E', H, M]; `axis`: the
    experts' mesh axis (None: not split)."""
    E, G, C, M = x.shape
    P = E // wi.shape[0]
    x = x.reshape(P, E // P, G * C, M)  # [P, E', G'·C, M]: peer i's experts' slots at i
    if axis:  # -> [P, E', G'·C, M]: this device's experts' slots from peer i at i
      x = jax.lax.all_to_all(x, axis, 0, 0, tiled=True)
    pad = -(G * C) % 8  # rows of zeros, so that blocks of a multiple of 8 rows divide them (Mosaic's rule)
    y = _ffn(jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))), wi, wo, vmem)[:, :, :G * C]
    if axis:
      y = jax.lax.all_to_all(y, axis, 0, 0, tiled=True)
    return y.reshape(E, G, C, M)

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return per_device(buffers, wi, wo)
  buffer_spec, weight_spec = nn.logical_to_mesh_axes(buffer_axes), nn.logical_to_mesh_axes(weight_axes)
  if weight_spec[2] is not None:
    raise ValueError(f"moe.expert_kernel='pallas' needs each expert's H whole on a device; the rules place it on "
                     f"{weight_spec[2]!r}")
  expert_axes = axes_of(weight_spec[0])
  if len(expert_axes) > 1 or set(expert_axes) - set(axes_of(buffer_spec[1])) or buffer_spec[0] is not None:
    raise ValueError(f"moe.expert_kernel='pallas' needs the experts on at most one mesh axis that splits the "
                     f"groups too, and buffers split by groups only: the rules give E {weight_spec[0]!r}, the "
                     f"buffers {buffer_spec!r}")
  axis = expert_axes[0] if expert_axes and mesh.shape[expert_axes[0]] > 1 else None
  w_out = jax.sharding.PartitionSpec(weight_spec[0], None, None)
  # check_vma=False: the kernels' outputs vary as their inputs do, which Pallas cannot infer; shard_map's
  # transpose then sums the weights' per-device gradients over the mesh axes that split only the groups.
  return jax.shard_map(functools.partial(per_device, axis=axis), mesh=mesh, in_specs=(buffer_spec, weight_spec, w_out),
                       out_specs=buffer_spec, check_vma=False)(buffers, wi, wo)

"""model.attention='pallas': the attention core of packed rows as Pallas kernels for TPUs (forward, and a backward
that recomputes the scores), the packing mask built inside from the segment ids.

Our rows are short (64 source, 40 target positions), so each row's scores [Q, K] fit in VMEM whole: no online
softmax. A kernel takes a block of rows and reads q, k, v lane-dense, [B, L, A·D] as the projections write them,
taking each head's D columns inside; read per head ([.., L, D] with D = 64) they would cost relayout copies into
half-empty 128-lane tiles (bench/RESULTS.md, "A Pallas attention kernel"). Each kernel declares its cost
(`pl.CostEstimate`): its matmuls' FLOPs and its operands' and outputs' bytes, which the TPU compiler's estimate
charges (a kernel that declares none is charged nothing). On a mesh the kernels run per device under `shard_map`
over the batch's mesh axes; off a TPU they run in Pallas's interpret mode (for tests: slow, not for training).
Letters as in `layers`: B rows, Q, K positions, A heads, D head dim; no attention dropout.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from gshard_mt.model.layers import NEG_INF, attention_mask

ROWS = 8  # rows per kernel block (the segment ids' block is [ROWS, L]: a multiple of 8 rows, or the whole batch)
_NT = (((1,), (1,)), ((), ()))  # x y^T
_TN = (((0,), (0,)), ((), ()))  # x^T y


def _probs(q, k, mask):
  """q [Q, D] (scaled), k [K, D] -> float32 softmax [Q, K] over the allowed keys."""
  s = jax.lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32)
  return jax.nn.softmax(jnp.where(mask, s, NEG_INF), -1)


def _forward_kernel(q_ref, k_ref, v_ref, qs_ref, ks_ref, o_ref, *, heads: int, causal: bool):
  """q [R, Q, A·D], k, v [R, K, A·D], segment ids [R, Q], [R, K] -> o [R, Q, A·D]."""
  D = q_ref.shape[-1] // heads
  for r in range(q_ref.shape[0]):
    mask = attention_mask(qs_ref[r][None], ks_ref[r][None], causal)[0, 0]  # [Q, K]
    out = []
    for a in range(heads):
      cols = slice(a * D, (a + 1) * D)
      probs = _probs(q_ref[r, :, cols], k_ref[r, :, cols], mask)
      out.append(jnp.dot(probs.astype(v_ref.dtype), v_ref[r, :, cols], preferred_element_type=jnp.float32))
    o_ref[r] = jnp.concatenate(out, -1).astype(o_ref.dtype)


def _backward_kernel(q_ref, k_ref, v_ref, do_ref, qs_ref, ks_ref, dq_ref, dk_ref, dv_ref, *, heads: int,
                     causal: bool):
  """The forward's inputs and the output's cotangent do [R, Q, A·D] -> dq, dk, dv (the scores recomputed)."""
  D = q_ref.shape[-1] // heads
  for r in range(q_ref.shape[0]):
    mask = attention_mask(qs_ref[r][None], ks_ref[r][None], causal)[0, 0]  # [Q, K]
    dq, dk, dv = [], [], []
    for a in range(heads):
      cols = slice(a * D, (a + 1) * D)
      q, k, v, do = (ref[r, :, cols] for ref in (q_ref, k_ref, v_ref, do_ref))
      probs = _probs(q, k, mask)
      dv.append(jax.lax.dot_general(probs.astype(do.dtype), do, _TN, preferred_element_type=jnp.float32))
      dp = jax.lax.dot_general(do, v, _NT, preferred_element_type=jnp.float32)
      ds = (probs * (dp - jnp.sum(dp * probs, -1, keepdims=True))).astype(q.dtype)  # softmax's backward
      dq.append(jnp.dot(ds, k, preferred_element_type=jnp.float32))
      dk.append(jax.lax.dot_general(ds, q, _TN, preferred_element_type=jnp.float32))
    for ref, parts in ((dq_ref, dq), (dk_ref, dk), (dv_ref, dv)):
      ref[r] = jnp.concatenate(parts, -1).astype(ref.dtype)


def _call(kernel, arrays, q_segments, k_segments, outputs, matmuls: int, heads: int, causal: bool):
  """Runs `kernel` over blocks of rows; its cost: `matmuls` [Q, K] x D matmuls per row and head, and its bytes.
  `outputs` names which of `arrays` each output is shaped like. Compiled for a TPU, the Mosaic kernel; for any
  other platform, Pallas's interpret mode (chosen where the program is lowered, not by the host's default
  backend: a TPU program compiled ahead of time on a CPU host gets the kernel)."""
  B, Q, AD = arrays[0].shape
  K = arrays[1].shape[1]
  rows = ROWS if B % ROWS == 0 else B
  block = lambda x: pl.BlockSpec((rows, *x.shape[1:]), lambda b: (b, 0, 0))  # noqa: E731
  ids = lambda x: pl.BlockSpec((rows, x.shape[1]), lambda b: (b, 0))  # noqa: E731
  out_arrays = [arrays[i] for i in outputs]
  nbytes = sum(x.size * x.dtype.itemsize for x in (*arrays, *out_arrays, q_segments, k_segments))
  cost = pl.CostEstimate(flops=2 * matmuls * B * Q * K * AD, transcendentals=B * heads * Q * K,
                         bytes_accessed=nbytes)
  run = lambda interpret: pl.pallas_call(  # noqa: E731
      functools.partial(kernel, heads=heads, causal=causal), grid=(B // rows,),
      in_specs=[block(x) for x in arrays] + [ids(q_segments), ids(k_segments)],
      out_specs=[block(x) for x in out_arrays], out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in out_arrays],
      cost_estimate=cost, interpret=interpret)
  return jax.lax.platform_dependent(*arrays, q_segments, k_segments, tpu=run(False), default=run(True))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _core(q, k, v, q_segments, k_segments, heads, causal):
  """q [B, Q, A·D], k, v [B, K, A·D] -> [B, Q, A·D]."""
  return _call(_forward_kernel, (q, k, v), q_segments, k_segments, (0,), 2, heads, causal)[0]


def _core_forward(q, k, v, q_segments, k_segments, heads, causal):
  return _core(q, k, v, q_segments, k_segments, heads, causal), (q, k, v, q_segments, k_segments)


def _core_backward(heads, causal, residuals, do):
  q, k, v, q_segments, k_segments = residuals
  grads = _call(_backward_kernel, (q, k, v, do), q_segments, k_segments, (0, 1, 2), 5, heads, causal)
  return (*grads, None, None)


_core.defvjp(_core_forward, _core_backward)


def pallas_attention(q, k, v, q_segments, k_segments, heads: int, causal: bool):
  """q [B, Q, A·D] (already scaled), k, v [B, K, A·D] with A = `heads`, segment ids [B, Q], [B, K] (0 = padding)
  -> [B, Q, A·D]: the packing's attention as `layers.attention_probs` and the einsum compute it, by the Pallas
  kernels. Lane-dense in and out: each head's D columns are taken inside the kernels, so no [B, L, A, D] layout
  (D = 64 fills half of a TPU tile's lanes) is ever written."""
  core = functools.partial(_core, heads=heads, causal=causal)
  mesh = jax.sharding.get_abstract_mesh()
  batch = nn.logical_to_mesh_axes(("batch",))[0] if not mesh.empty else None
  if batch is not None:  # each device's rows through the kernels
    spec = jax.sharding.PartitionSpec(batch)
    # check_vma=False: the kernels' outputs vary over the batch's axes as their inputs do, which Pallas cannot infer.
    core = jax.shard_map(core, mesh=mesh, in_specs=(spec,) * 5, out_specs=spec, check_vma=False)
  return core(q, k, v, q_segments, k_segments)

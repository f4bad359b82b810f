"""optimizer.kernel='pallas': Adafactor's update (`optimizer`) with every weight read in three passes, as Pallas
kernels for TPUs, behind the same state as the optax chain (so a checkpoint restores with either setting).

XLA compiles the chain into more passes over each weight, and it copies weights into VMEM ahead of the passes
that follow a reduction, which the TPU compiler's estimate charges at about twice the pass (docs/decisions.md).
Here, for a weight X with gradient G, decay d, step size lr and weight decay wd:

  1. sums of G^2 (over L and over S for a factored weight) and of X^2: the global norm, hence the clipping scale
     s; V_row, V_col; RMS(X)
  2. factored: the sum of (G R C)^2, R and C the row and column factors from V_row, V_col: RMS(U), U = s G R C;
     not factored (V as big as X): V' = d V + (1 - d)(s^2 G^2 + eps), U = s G / sqrt(V'): the sum of U^2
  3. X <- (1 - wd) X - a U,  a = lr max(1e-3, RMS(X)) / max(1, RMS(U)); V <- V' (not factored)

each pass one kernel over [T, L] blocks of the weight's [B, S, L] view (`_order`: a factored weight's S and L are
its factored dims; T divides S, so that a block lies in one [S, L] matrix), its operands pinned to HBM. A weight too
small to be worth a kernel, or whose factored dims are not its last two or are split over devices, takes the same
passes as jnp over the whole array (`_run` with T=None), which is also what the kernels compute off a TPU in
tests. Where the step is not finite everything is kept, inside the last pass (no second copy of the weights).

On a mesh each kernel weight runs per device under `shard_map` with its PartitionSpec (from `optimizer`'s caller,
the state's shardings); only the sums over the whole weight cross devices (psum over its axes). Each kernel
declares its bytes (`pl.CostEstimate`), which is what the TPU compiler's estimate charges it.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P
from optax._src.factorized import _factored_dims  # the rule that laid out the state (optax's, not ours to copy)

from gshard_mt.kernels import vmem as pallas_vmem
from gshard_mt.kernels.pallas import on_tpu

BLOCK_BYTES = 1 << 20  # one [T, L] float32 block: four operands, double-buffered, stay well inside VMEM
MIN_KERNEL_SIZE = 1 << 16  # smaller weights (layer norm scales, biases) in plain jnp, which XLA fuses


def _decayed(v, g2, s, d, eps):
  """The second moment after one step: d V + (1 - d)(s^2 G^2 + eps), G^2 a square or a mean of squares."""
  return d * v + (1 - d) * (s * s * g2 + eps)


def _step(x, u, a, keep, finite):
  """X after the step: (1 - wd) X - a U where the step is finite, X where it is not."""
  return jnp.where(finite > 0, keep * x - a * u, x)


# The passes' bodies, over [..., T, L] blocks (a kernel's) or whole [B, S, L] arrays (jnp). `sc` holds the
# scalars: an SMEM ref in a kernel, an array in jnp; each returns its outputs in `_run`'s order.
def _stats(sc, g, x):
  """Pass 1: sums of G^2 over L [.., T, 1] and over T [.., 1, L] (for a factored weight); of X^2 over L."""
  g2 = g * g
  return jnp.sum(g2, -1, keepdims=True), jnp.sum(g2, -2, keepdims=True), jnp.sum(x * x, -1, keepdims=True)


def _factored_sums(sc, g, row, col):
  """Pass 2, factored: sums over L of (G R C)^2; row [.., T, 1] and col [.., 1, L] the factors."""
  u = g * row * col
  return (jnp.sum(u * u, -1, keepdims=True),)


def _factored_step(sc, g, row, col, x):
  """Pass 3, factored; sc = (a, keep, finite)."""
  return (_step(x, g * row * col, sc[0], sc[1], sc[2]),)


def _unfactored_sums(sc, g, v, eps):
  """Pass 2, not factored; sc = (s, d): sums over L of U^2, U = s G / sqrt(V')."""
  u = sc[0] * g * jax.lax.rsqrt(_decayed(v, g * g, sc[0], sc[1], eps))
  return (jnp.sum(u * u, -1, keepdims=True),)


def _unfactored_step(sc, g, v, x, eps):
  """Pass 3, not factored; sc = (s, d, a, keep, finite): V', X after the step."""
  new_v = _decayed(v, g * g, sc[0], sc[1], eps)
  u = sc[0] * g * jax.lax.rsqrt(new_v)
  return jnp.where(sc[4] > 0, new_v, v), _step(x, u, sc[2], sc[3], sc[4])


def _rows_per_block(B: int, S: int, L: int) -> int | None:
  """T: a divisor of S with a [T, L] float32 block within BLOCK_BYTES and T a multiple of 8 (or all B·S rows);
  None where there is none."""
  return pallas_vmem.divisor_rows(S, B * S, BLOCK_BYTES // (4 * L))


def _run(body, scalars, ins, outs, T: int | None):
  """body over `ins` ([B, S, L] 'tile's, [B, S, 1] 'row's, [B, 1, L] 'col's) -> `outs` (kinds 'tile', 'row',
  'col': a col sums over S), as one Pallas kernel over [T, L] blocks (T None: jnp over the whole arrays). The
  last tile inputs are updated in place by the tile outputs."""
  sc = jnp.stack([jnp.asarray(s, jnp.float32) for s in scalars]) if scalars else jnp.zeros((1,), jnp.float32)
  if T is None:
    return body(sc, *ins)
  B, S, L = ins[0].shape
  per_b, n = S // T, B * S // T
  spec = {"tile": pl.BlockSpec((T, L), lambda i: (i, 0)), "row": pl.BlockSpec((T, 1), lambda i: (i, 0)),
          "col": pl.BlockSpec((None, 1, L), lambda i: (jax.lax.div(i, per_b), 0, 0))}
  flat = {"tile": (B * S, L), "row": (B * S, 1), "col": (B, 1, L)}
  kinds = ["tile" if x.shape == (B, S, L) else "row" if x.shape == (B, S, 1) else "col" for x in ins]
  out_specs = [pl.BlockSpec((None, 1, L), lambda i: (i, 0, 0)) if k == "col" else spec[k] for k in outs]
  out_shapes = [jax.ShapeDtypeStruct((n, 1, L) if k == "col" else flat[k], jnp.float32) for k in outs]
  tiles_in = [i for i, k in enumerate(kinds) if k == "tile"]
  tiles_out = [o for o, k in enumerate(outs) if k == "tile"]
  aliases = {1 + i: o for i, o in zip(tiles_in[len(tiles_in) - len(tiles_out):], tiles_out)}
  nbytes = sum(x.nbytes for x in ins) + sum(math.prod(s.shape) * 4 for s in out_shapes)

  def kernel(sc_ref, *refs):
    results = body(sc_ref, *(r[...] for r in refs[:len(ins)]))
    for ref, y in zip(refs[len(ins):], results):
      ref[...] = y.astype(ref.dtype)

  run = lambda interpret: pl.pallas_call(  # noqa: E731
      kernel, grid=(n,), in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)] + [spec[k] for k in kinds],
      out_specs=out_specs, out_shape=out_shapes, input_output_aliases=aliases,
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
      cost_estimate=pl.CostEstimate(flops=8 * B * S * L, transcendentals=0, bytes_accessed=nbytes),
      interpret=interpret)

  results = on_tpu(run, sc, *(x.reshape(flat[k]) for x, k in zip(ins, kinds)), pin_from=1)  # not the scalars
  return [y.reshape(B, per_b, L).sum(1, keepdims=True) if k == "col" else y.reshape((B, S, L) if k == "tile"
          else (B, S, 1)) for y, k in zip(results, outs)]


def _sum(x, axes):
  """The sum of x over the whole weight: x's, summed over the mesh axes the weight is split over."""
  total = jnp.sum(x)
  return jax.lax.psum(total, axes) if axes else total


class _Plan(NamedTuple):
  """How one weight is updated: optax's factored dims (d1, d0) or None, its view (`_order`, and (B, S, L) on one
  device) and the rows per block (None: jnp instead of kernels)."""

  factored: tuple[int, int] | None
  order: tuple[int, ...]
  dims: tuple[int, int, int]
  rows: int | None

  def view(self, y):
    return jnp.transpose(y, self.order).reshape(self.dims)

  def unview(self, y, shape):
    return y.reshape([shape[i] for i in self.order]).transpose(np.argsort(self.order))

  def to_moment(self, y, shape, drop: int):
    """A statistic over the view's dim `drop` ([B, S] or [B, L]) in the shape optax keeps it (the weight's less
    that dim, in their order)."""
    kept = [i for i in self.order if i != drop]
    return y.reshape([shape[i] for i in kept]).transpose(np.argsort(kept))

  def from_moment(self, y, drop: int):
    """`to_moment`'s inverse, as [B, S, 1] (drop: the view's L) or [B, 1, L] (its S)."""
    B, S, L = self.dims
    kept = [i for i in self.order if i != drop]
    y = y.transpose(np.argsort(np.argsort(kept)))
    return y.reshape((B, S, 1) if drop == self.order[-1] else (B, 1, L))


def _squares(g, x, v_row, v_col, plan: _Plan, axes: tuple):
  """Pass 1, before the clipping scale is known -> (the means of G^2 in V_row's and V_col's shapes (factored;
  placeholders otherwise), the sums of G^2 and of X^2 over the whole weight)."""
  g_rows, g_cols, x2 = _run(_stats, (), [plan.view(g), plan.view(x)], ["row", "col", "row"], plan.rows)
  row_mean = col_mean = jnp.zeros((1,), jnp.float32)
  if plan.factored is not None:  # a mean of G^2 over L (g_rows) or over S (g_cols), as V_row and V_col are kept
    _, S, L = plan.dims
    by_s, by_l = g_rows[..., 0] / L, g_cols[:, 0, :] / S  # [B, S], [B, L]
    d1, d0 = plan.factored  # V_row is the mean over d0, V_col over d1
    by_dim = {plan.order[-1]: by_s, plan.order[-2]: by_l}
    row_mean, col_mean = (plan.to_moment(by_dim[d], x.shape, d) for d in (d0, d1))
  return row_mean, col_mean, _sum(g_rows, axes), _sum(x2, axes)


def _apply(g, x, v_row, v_col, v, row_mean, col_mean, x2, sc: dict, plan: _Plan, axes: tuple, size: int,
           settings: dict):
  """The passes after the clipping scale -> (X, V_row, V_col, V). sc: the step's scalars (s, d, lr, keep,
  finite); row_mean, col_mean, x2: from `_squares`; size: the weight's, on all devices; axes: the mesh axes x is
  split over (inside shard_map), () outside."""
  eps, s, d, finite = settings["eps"], sc["s"], sc["d"], sc["finite"]

  def scale(u2, s_u=1.0):  # a: lr max(min_scale, RMS(X)) s_u / max(1, RMS(U) / threshold)
    rms_u = s_u * jnp.sqrt(_sum(u2, axes) / size)
    rms_x = jnp.maximum(settings["min_scale"], jnp.sqrt(x2 / size))
    return sc["lr"] * rms_x * s_u / jnp.maximum(1.0, rms_u / settings["clipping_threshold"])

  G, X = plan.view(g), plan.view(x)
  if plan.factored is None:
    V = plan.view(v)
    (u2,) = _run(functools.partial(_unfactored_sums, eps=eps), (s, d), [G, V], ["row"], plan.rows)
    new_v, new_x = _run(functools.partial(_unfactored_step, eps=eps), (s, d, scale(u2), sc["keep"], finite),
                        [G, V, X], ["tile", "tile"], plan.rows)
    return plan.unview(new_x, x.shape), v_row, v_col, plan.unview(new_v, v.shape)
  new_row, new_col = _decayed(v_row, row_mean, s, d, eps), _decayed(v_col, col_mean, s, d, eps)
  row_factor = jax.lax.rsqrt(new_row / jnp.mean(new_row, -1, keepdims=True))
  col_factor = jax.lax.rsqrt(new_col)
  d1, d0 = plan.factored
  factors = {d0: plan.from_moment(row_factor, d0), d1: plan.from_moment(col_factor, d1)}
  on_s, on_l = factors[plan.order[-1]], factors[plan.order[-2]]  # [B, S, 1], [B, 1, L]
  (u2,) = _run(_factored_sums, (), [G, on_s, on_l], ["row"], plan.rows)
  (new_x,) = _run(_factored_step, (scale(u2, s), sc["keep"], finite), [G, on_s, on_l, X], ["tile"], plan.rows)
  keep = lambda new, old: jnp.where(finite > 0, new, old)  # noqa: E731
  return plan.unview(new_x, x.shape), keep(new_row, v_row), keep(new_col, v_col), v


def _order(shape: tuple, factored) -> tuple[int, ...]:
  """A weight's dims in its [B, S, L] view, major to minor: as they are, except that a factored weight puts its
  factored dims last (a copy: such weights take jnp), and a weight not factored with a last dim under a lane's
  128 puts its largest dim last, where the TPU lays it out (f32[512, 8, 64] in memory is [8, 64, 512]), so that
  the view is no copy."""
  n = len(shape)
  if factored is not None:  # its factored dims last, in their order (the weight's own order where they are last)
    return tuple(i for i in range(n) if i not in factored) + tuple(sorted(factored))
  if n < 2 or shape[-1] >= 128:
    return tuple(range(n))
  big = int(np.argmax(shape))
  return tuple(i for i in range(n) if i != big) + (big,)


def _dims(shape: tuple, factored) -> tuple[int, int, int]:
  """(B, S, L) of a weight's view, its dims in `_order`: factored, its last two are S and L; otherwise L is the
  last and S all the rest."""
  shape, size = [shape[i] for i in _order(shape, factored)], math.prod(shape)
  if factored is not None:
    return size // (shape[-2] * shape[-1]), shape[-2], shape[-1]
  return 1, size // shape[-1], shape[-1]


def _entries(spec: P, ndim: int) -> tuple:
  """A PartitionSpec's entries for each of a weight's `ndim` dims (None for the dims it leaves out)."""
  return tuple(spec) + (None,) * (ndim - len(spec))


def _axes(spec: P) -> tuple[str, ...]:
  """The mesh axes a PartitionSpec splits over, in order."""
  return tuple(a for e in spec if e is not None for a in ((e,) if isinstance(e, str) else e))


def _local_shape(shape: tuple, spec: P, mesh) -> tuple:
  """A weight's shape on one device."""
  return tuple(n // math.prod(mesh.shape[a] for a in _axes(P(e))) for n, e in zip(shape, _entries(spec, len(shape))))


def _plan(x, spec: P, mesh, min_dim_size_to_factor: int) -> _Plan:
  """A weight's `_Plan`: kernels where it is big enough, its factored dims (if any) are its last two and whole on
  each device, and blocks tile it there."""
  factored = _factored_dims(x.shape, True, min_dim_size_to_factor)
  dims = _dims(x.shape if mesh.empty else _local_shape(x.shape, spec, mesh), factored)
  kernel = x.size >= MIN_KERNEL_SIZE and x.ndim >= 2 and (
      factored is None or (set(factored) == {x.ndim - 2, x.ndim - 1} and _entries(spec, x.ndim)[-2:] == (None, None)))
  return _Plan(factored, _order(x.shape, factored), dims, _rows_per_block(*dims) if kernel else None)


def update(grads, params, v_row, v_col, v, specs, *, d, lr, keep, clip_norm: float, loss_finite, settings: dict):
  """One Adafactor step of every weight -> (params, v_row, v_col, v, the gradient's global norm, finite); trees
  as the params' (v_* as optax's FactoredState keeps them), specs the params' PartitionSpecs (None: none split).
  d: the decay 1 - t^-0.8; lr: the step size; keep: 1 - weight decay; clip_norm: of the global norm (0: none).
  Nothing changes unless `loss_finite` and the norm are finite. settings: eps, min_dim_size_to_factor,
  clipping_threshold, min_scale (optimizer.ADAFACTOR's)."""
  mesh = jax.sharding.get_abstract_mesh()
  treedef = jax.tree.structure(params)
  specs = [P()] * treedef.num_leaves if specs is None else jax.tree.leaves(specs, is_leaf=lambda p: isinstance(p, P))
  leaves = list(zip(*map(jax.tree.leaves, (grads, params, v_row, v_col, v)), specs))
  plans = [_plan(x, spec, mesh, settings["min_dim_size_to_factor"]) for _, x, _, _, _, spec in leaves]

  def on_devices(fn, spec, plan, args, in_specs, out_specs):
    """fn(*args) as it is: jnp, which XLA partitions, or kernels without a mesh; per device where kernels meet a
    mesh (XLA does not partition Mosaic kernels, even where the weight is replicated)."""
    if plan.rows is None or mesh.empty:
      return fn(*args, axes=())
    return jax.shard_map(functools.partial(fn, axes=_axes(spec)), mesh=mesh, in_specs=in_specs,
                         out_specs=out_specs, check_vma=False)(*args)

  def stat_specs(x, spec, plan):  # V_row's and V_col's: the weight's less the dim each is reduced over
    drop = lambda i: P(*(e for j, e in enumerate(_entries(spec, x.ndim)) if j != i))  # noqa: E731
    return (drop(plan.factored[1]), drop(plan.factored[0])) if plan.factored else (P(), P())

  stats = [stat_specs(x, spec, plan) for (_, x, _, _, _, spec), plan in zip(leaves, plans)]
  squares = [on_devices(functools.partial(_squares, plan=plan), spec, plan, (g, x, vr, vc), (spec, spec, *st),
                        (*st, P(), P())) for (g, x, vr, vc, _, spec), plan, st in zip(leaves, plans, stats)]
  norm = jnp.sqrt(sum(q[2] for q in squares))
  finite = jnp.asarray(loss_finite) & jnp.isfinite(norm)
  s = jnp.where(norm < clip_norm, 1.0, clip_norm / norm) if clip_norm else 1.0
  sc = {k: jnp.asarray(val, jnp.float32) for k, val in dict(s=s, d=d, lr=lr, keep=keep, finite=finite).items()}
  out = []
  for (g, x, vr, vc, vv, spec), plan, st, (row_mean, col_mean, _, x2) in zip(leaves, plans, stats, squares):
    v_spec = P() if plan.factored else spec
    fn = functools.partial(_apply, plan=plan, size=x.size, settings=settings)
    out.append(on_devices(fn, spec, plan, (g, x, vr, vc, vv, row_mean, col_mean, x2, sc),
                          (spec, spec, *st, v_spec, *st, P(), P()), (spec, *st, v_spec)))
  return (*(jax.tree.unflatten(treedef, [o[k] for o in out]) for k in range(4)), norm, finite)

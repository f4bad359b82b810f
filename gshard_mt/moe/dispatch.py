"""Ways to move tokens to their experts and back, behind one interface: `dispatch(x [G, S, M])` and `combine`,
from any router's Routing (K assignments per token).

- EinsumDispatcher: the paper's one-hot einsums over the dense [G, S, E, C] tensors (the readable reference).
- IndexDispatcher: gathers by slot index, no dense one-hot, the same outputs and gradients; 'index_gather' with
  gathers for its backward passes too.
Both fill capacity buffers [E, G, C, M], E-major as the all-to-alls send them, written and read in place by
gathers with G as batch dimension (one transpose, in the backward: `take_slots`; docs/decisions.md).
- GroupedDispatcher: no buffers; `dispatch -> [R, M]`, one row per kept assignment in blocks by expert
  (`group_sizes` [E]), for grouped matmuls over the real assignments only.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from gshard_mt.moe.gating import Routing


@jax.custom_vjp
def take_rows(x: jax.Array, index: jax.Array, readers: jax.Array) -> jax.Array:
  """x [N, M], index int32 [...] in [0, N) -> x[index] [..., M], whose backward pass is a gather, not a
  scatter-add.

  readers int32 [N, J]: the positions r of index.reshape(-1) (R of them) with index[r] = n whose gradient reaches
  row n, R where fewer than J do; then dx[n] = sum_j dout[readers[n, j]]. Positions that read n but are left out
  of `readers` must get a zero gradient (a dropped assignment's, weighted 0 after the gather)."""
  del readers
  return x[index]


def _take_rows_backward(readers, dout):
  rows = dout.reshape(-1, dout.shape[-1])
  return jnp.take(rows, readers, axis=0, mode="fill", fill_value=0).sum(axis=1), None, None


take_rows.defvjp(lambda x, index, readers: (x[index], readers), _take_rows_backward)


def _by_group(a: jax.Array, index: jax.Array, batch: int) -> jax.Array:
  """Rows of a [..., M] picked per group: G is dimension `batch` of `a` and dimension 1 of index [P, G, Q, n],
  whose last dimension indexes a's other dimensions but M; the gather keeps G as its batch dimension (so the
  partitioner keeps it sharded) -> [P, G, Q, M]."""
  others = tuple(d for d in range(a.ndim - 1) if d != batch)
  dnums = jax.lax.GatherDimensionNumbers(offset_dims=(3,), collapsed_slice_dims=others, start_index_map=others,
                                         operand_batching_dims=(batch,), start_indices_batching_dims=(1,))
  return jax.lax.gather(a, index, dnums, slice_sizes=(1,) * (a.ndim - 1) + (a.shape[-1],),
                        mode="promise_in_bounds")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def take_slots(y: jax.Array, slot: jax.Array, num_experts: int, capacity: int) -> jax.Array:
  """y [E, G, C, M] read in place, slot int32 [K, G, S] = e * C + c of each kept assignment, a slot of its own past
  E * C of a dropped one (which reads the last slot, for the caller to weigh 0) -> [K, G, S, M].

  The backward scatters into G-major buffers [G, E, C, M], then transposes them (with G not leading, XLA's TPU
  compiler turns the scatter-add into a loop at some shapes). Its indices are unique (one kept assignment per
  slot, each dropped one out of bounds on its own), so XLA's GPU scatter stores instead of adding atomically.
  """
  slot = jnp.minimum(slot, num_experts * capacity - 1)
  return _by_group(y, jnp.stack([slot // capacity, slot % capacity], -1), batch=1)


def _take_slots_backward(num_experts, capacity, slot, dout):
  _, G, _, M = dout.shape
  add = lambda d, s: jnp.zeros((num_experts * capacity, M), d.dtype).at[s.reshape(-1)].add(  # noqa: E731
      d.reshape(-1, M), mode="drop", unique_indices=True)
  buffers = jax.vmap(add, in_axes=(1, 1))(dout, slot).reshape(G, num_experts, capacity, M)
  return buffers.transpose(1, 0, 2, 3), None


take_slots.defvjp(lambda y, slot, E, C: (take_slots(y, slot, E, C), slot), _take_slots_backward)


@struct.dataclass
class EinsumDispatcher:
  """GShard Algorithm 2's dispatch and combine einsums."""

  routing: Routing

  def dispatch(self, x: jax.Array) -> jax.Array:
    """[G, S, M] -> [E, G, C, M]."""
    return jnp.einsum("GSEC,GSM->EGCM", self.routing.dispatch_mask.astype(x.dtype), x)

  def combine(self, y: jax.Array) -> jax.Array:
    """[E, G, C, M] -> [G, S, M]."""
    return jnp.einsum("GSEC,EGCM->GSM", self.routing.combine_weights.astype(y.dtype), y)


@struct.dataclass
class IndexDispatcher:
  """Gather/scatter by slot index: O(G·E·C·M) data movement, no dense one-hot. gather_backward=True
  ('index_gather'): the backward passes gather too (`take_rows`) instead of XLA's scatter-adds, the layer's
  longest kernels in the H100 profile; they cost more on the TPU estimate (docs/decisions.md)."""

  routing: Routing
  gather_backward: bool = struct.field(pytree_node=False, default=False)

  def _position_of_slot(self) -> jax.Array:
    """int32 [G, E·C]: the assignment s*K + k kept in each slot e*C + c, S*K for an empty slot."""
    r = self.routing
    G, S, K = r.slot.shape
    EC = r.num_experts * r.capacity
    flat = self._flat_slot(empty=EC).reshape(G, S * K)  # dropped assignments write out of bounds: discarded
    positions = jnp.arange(S * K, dtype=jnp.int32)
    return jax.vmap(lambda f: jnp.full((EC,), S * K, jnp.int32).at[f].set(positions, mode="drop"))(flat)

  def _flat_slot(self, empty: int) -> jax.Array:
    """int32 [G, S, K]: e * C + c of each kept assignment, `empty` for dropped ones."""
    r = self.routing
    return jnp.where(r.kept, r.expert_index * r.capacity + r.slot, empty)

  def dispatch(self, x: jax.Array) -> jax.Array:
    """[G, S, M] -> [E, G, C, M]. An empty slot holds its group's last token instead of zeros: no assignment
    reads it back with a nonzero weight (`combine`), so its gradients are exact zeros and the layer's outputs and
    gradients are those of zero-filled slots, without a padded copy of x (docs/decisions.md)."""
    G, S, M = x.shape
    E, C, K = self.routing.num_experts, self.routing.capacity, self.routing.slot.shape[-1]
    token_of_slot = jnp.minimum(self._position_of_slot() // K, S - 1).reshape(G, E, C)  # s, or S - 1 if empty
    if self.gather_backward:  # a token's gradient gathers its K slots'; per group (G a batch dimension), at axis 1
      return jax.vmap(take_rows, out_axes=1)(x, token_of_slot, self._flat_slot(empty=E * C))
    # One gather over all groups with G as its batch dimension: the rows come out E-major, as the all-to-all sends
    # them (the per-group vmap writes G-major rows, which XLA then transposes in HBM).
    return _by_group(x, token_of_slot.transpose(1, 0, 2)[..., None], batch=0)

  def combine(self, y: jax.Array) -> jax.Array:
    """[E, G, C, M] -> [G, S, M], read in place from E-major buffers (as the all-to-all delivers them); dropped
    assignments carry weight 0."""
    E, G, C, M = y.shape
    S, K = self.routing.slot.shape[1:]
    if self.gather_backward:  # a slot's gradient is its one kept assignment's, at k*S + s in the K-major rows
      flat = self._flat_slot(empty=0)  # GSK; a dropped assignment reads any slot, weighted 0
      p = self._position_of_slot()
      readers = jnp.where(p < S * K, p % K * S + p // K, K * S)[..., None]
      rows = y.transpose(1, 0, 2, 3).reshape(G, E * C, M)  # per group: G-major
      picked = jax.vmap(take_rows, out_axes=1)(rows, flat.transpose(0, 2, 1), readers)
    else:
      # A dropped assignment's slot lies outside the buffers, one of its own (the scatter's indices are all
      # unique); take_slots reads the last slot for it, weighted 0.
      outside = E * C + jnp.arange(S * K, dtype=jnp.int32).reshape(S, K)
      picked = take_slots(y, self._flat_slot(empty=outside).transpose(2, 0, 1), E, C)
    # K-major [K, G, S, M]: the gathered rows are laid out as the sum over K reads them (K next to M: a relayout).
    return jnp.einsum("GSK,KGSM->GSM", self.routing.weight.astype(y.dtype), picked)


@struct.dataclass
class GroupedDispatcher:
  """Rows in blocks by expert for grouped matmuls: kept assignment (g, s, k) of expert e in slot c goes to row
  (rows of experts before e) + (e's kept assignments in groups before g) + c. A (group, expert)'s slots are 0, 1,
  ... with no gap (gating.assign_slots), so this numbers the kept assignments 0 .. kept - 1 with no sort."""

  routing: Routing

  @property
  def num_rows(self) -> int:
    """R: every assignment, or every capacity slot if fewer."""
    G, S, K = self.routing.expert_index.shape
    return min(G * S * K, G * self.routing.num_experts * self.routing.capacity)

  def _counts(self) -> jax.Array:
    """int32 [G, E]: kept assignments per group and expert."""
    r = self.routing
    return jnp.sum(jax.nn.one_hot(r.expert_index, r.num_experts, dtype=jnp.int32) * r.kept[..., None], axis=(1, 2))

  @property
  def group_sizes(self) -> jax.Array:
    """int32 [E]: rows of each expert, summing to R: the rows no kept assignment uses go to the last expert, so
    the grouped matmuls compute every row (a row left out may hold anything on TPU) and nothing reads them."""
    sizes = self._counts().sum(axis=0)
    return sizes.at[-1].add(self.num_rows - sizes.sum())

  def _row(self) -> jax.Array:
    """int32 [G, S, K]: the row of each kept assignment, R for dropped ones."""
    r = self.routing
    G, S, K = r.expert_index.shape
    counts = self._counts()
    sizes = counts.sum(axis=0)
    first = (jnp.cumsum(sizes) - sizes)[None, :] + jnp.cumsum(counts, axis=0) - counts  # GE: first row of (g, e)
    row = jnp.take_along_axis(first, r.expert_index.reshape(G, S * K), axis=1).reshape(G, S, K) + r.slot
    return jnp.where(r.kept, row, self.num_rows)

  def dispatch(self, x: jax.Array) -> jax.Array:
    """[G, S, M] -> [R, M]: each row holds its assignment's token; the unused rows hold token 0."""
    G, S, M = x.shape
    token = jnp.broadcast_to(jnp.arange(G * S, dtype=jnp.int32).reshape(G, S, 1), self.routing.slot.shape)
    token_of_row = jnp.zeros((self.num_rows,), jnp.int32).at[self._row().reshape(-1)].set(
        token.reshape(-1), mode="drop")  # dropped assignments write out of bounds: discarded
    return x.reshape(G * S, M)[token_of_row]

  def combine(self, y: jax.Array) -> jax.Array:
    """[R, M] -> [G, S, M]; a dropped assignment reads any row, with its weight 0."""
    # K-major [K, G, S, M]: the gathered rows reshape to it without moving (K next to M would be a relayout).
    picked = y[jnp.minimum(self._row(), self.num_rows - 1).transpose(2, 0, 1)]
    return jnp.einsum("GSK,KGSM->GSM", self.routing.weight.astype(y.dtype), picked)


DISPATCHERS = {"einsum": EinsumDispatcher, "index": IndexDispatcher,
               "index_gather": functools.partial(IndexDispatcher, gather_backward=True), "grouped": GroupedDispatcher}


def make_dispatcher(name: str, routing: Routing):
  """The dispatcher called `name` (a key of DISPATCHERS, checked with the config: training.validate) for this
  routing."""
  return DISPATCHERS[name](routing)

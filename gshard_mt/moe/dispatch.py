"""Two ways to move tokens into expert buffers and back, behind one interface.

`dispatch(x: [G, S, M]) -> [E, G, C, M]` fills each expert's buffer slots; `combine(y: [G, E, C, M]) -> [G, S, M]`
returns the weighted expert outputs to their tokens. `combine` takes the layout the paper's last expert einsum
produces (`EGCH,EHM->GECM`), so the E -> G reshard happens there.

- EinsumDispatcher: the paper's one-hot einsums over the dense [G, S, E, C] tensors (the readable reference).
- IndexDispatcher: gathers by slot index; never builds the [G, S, E, C] one-hot (same outputs and gradients).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from gshard_mt.moe.gating import Routing


@struct.dataclass
class EinsumDispatcher:
  """GShard Algorithm 2's dispatch and combine einsums."""

  routing: Routing

  def dispatch(self, x: jax.Array) -> jax.Array:
    """[G, S, M] -> [E, G, C, M]."""
    return jnp.einsum("GSEC,GSM->EGCM", self.routing.dispatch_mask.astype(x.dtype), x)

  def combine(self, y: jax.Array) -> jax.Array:
    """[G, E, C, M] -> [G, S, M]."""
    return jnp.einsum("GSEC,GECM->GSM", self.routing.combine_weights.astype(y.dtype), y)


@struct.dataclass
class IndexDispatcher:
  """Gather/scatter by slot index: O(G·E·C·M) data movement, no dense one-hot."""

  routing: Routing

  def _flat_slot(self, empty: int) -> jax.Array:
    """int32 [G, S, K]: e * C + c of each kept assignment, `empty` for dropped ones."""
    r = self.routing
    return jnp.where(r.kept, r.expert_index * r.capacity + r.slot, empty)

  def dispatch(self, x: jax.Array) -> jax.Array:
    """[G, S, M] -> [E, G, C, M]; empty slots are zeros."""
    G, S, M = x.shape
    E, C = self.routing.num_experts, self.routing.capacity
    flat = self._flat_slot(empty=E * C).reshape(G, -1)  # dropped assignments write out of bounds: discarded
    token = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32)[:, None], (S, 2)).reshape(1, -1)
    # token_of_slot[g, e*C + c] = s, or S (a row of zeros) when the slot is empty.
    token_of_slot = jax.vmap(lambda f, t: jnp.full((E * C,), S, jnp.int32).at[f].set(t, mode="drop"))(
        flat, jnp.broadcast_to(token, flat.shape))
    x_padded = jnp.concatenate([x, jnp.zeros((G, 1, M), x.dtype)], axis=1)
    buffers = jax.vmap(lambda xg, idx: xg[idx])(x_padded, token_of_slot)  # [G, E*C, M]
    return buffers.reshape(G, E, C, M).transpose(1, 0, 2, 3)

  def combine(self, y: jax.Array) -> jax.Array:
    """[G, E, C, M] -> [G, S, M]; dropped assignments carry weight 0."""
    G, E, C, M = y.shape
    S = self.routing.slot.shape[1]
    flat = self._flat_slot(empty=0).reshape(G, -1)  # any valid row: its weight is 0
    picked = jax.vmap(lambda yg, idx: yg[idx])(y.reshape(G, E * C, M), flat).reshape(G, S, 2, M)
    return jnp.einsum("GSK,GSKM->GSM", self.routing.weight.astype(y.dtype), picked)


DISPATCHERS = {"einsum": EinsumDispatcher, "index": IndexDispatcher}  # the automatic ones of MoeConfig.DISPATCHES


def make_dispatcher(name: str, routing: Routing):
  """The dispatcher called `name` ('einsum' or 'index') for this routing."""
  if name not in DISPATCHERS:
    raise ValueError(f"unknown dispatch {name!r}; expected one of {tuple(DISPATCHERS)}")
  return DISPATCHERS[name](routing)

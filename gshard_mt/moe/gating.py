"""Top-2 gating, GShard's Algorithm 1, as pure functions.

Letters: G groups, S tokens per group, E experts, C expert capacity (slots per expert per group), K = 2 choices.
The rules (float32 softmax, normalisation before any drop, top-1 before top-2 in the buffers, random second-expert
policy decided before positions, padding left out of everything) are those of Lingvo's `Top2GatingOnLogits`,
as GShard's Algorithm 1 and section 2.2 describe them.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
from flax import struct

from gshard_mt.config.moe import SECOND_EXPERT_POLICIES


def expert_capacity(group_size: int, num_experts: int, capacity_factor: float, min_capacity: int = 4,
                    num_selected: int = 2) -> int:
  """C = max(min_capacity, ceil(capacity_factor * k * S / E)), k = num_selected experts per token: the paper's
  2N/E per group at factor 1.0 and k = 2."""
  for name, value in (("group_size", group_size), ("num_experts", num_experts), ("min_capacity", min_capacity),
                      ("num_selected", num_selected)):
    _check_positive_int(name, value)
  if not capacity_factor > 0:
    raise ValueError(f"capacity_factor must be > 0, got {capacity_factor!r}")
  # Rounding first keeps 1.1 * 2 * 160 / 32 = 11.000000000000002 from becoming 12.
  return max(min_capacity, math.ceil(round(capacity_factor * num_selected * group_size / num_experts, 6)))


def cap_logits(logits: jax.Array, cap: float) -> jax.Array:
  """Soft cap `cap * tanh(logits / cap)`; cap <= 0 means no cap. Any shape."""
  return logits if cap <= 0 else cap * jnp.tanh(logits / cap)


@struct.dataclass
class Routing:
  """Where each token goes, in compact form; the dense GShard tensors are derived on demand.

  expert_index: int32 [G, S, K]  the expert of each assignment: e1, e2 for top-2 (moe.routers: other K).
  slot:         int32 [G, S, K]  buffer position c of each assignment (meaningful where `kept`).
  weight:       f32   [G, S, K]  normalised gates g1, g2; 0 where the assignment was dropped.
  kept:         bool  [G, S, K]  the assignment occupies a slot (< C) and survived the second-expert policy.
  aux_loss:     f32 []           load-balancing loss, mean(density * proxy) * E^2 (1.0 when balanced).
  z_loss:       f32 []           mean over real tokens of logsumexp(logits)^2.
  metrics:      dict of f32 (`routing_metrics`): the same keys for every router.
  requested:    int32 [E]     assignments the router asked of each expert before capacity: every choice of every
                real token (not a second choice the 'random' policy declined); what moe.balance='bias' balances.
  """

  expert_index: jax.Array
  slot: jax.Array
  weight: jax.Array
  kept: jax.Array
  aux_loss: jax.Array
  z_loss: jax.Array
  metrics: dict
  num_experts: int = struct.field(pytree_node=False)
  capacity: int = struct.field(pytree_node=False)
  requested: jax.Array | None = None

  def _dense(self, values: jax.Array) -> jax.Array:
    """[G, S, K] values -> [G, S, E, C], placed at (expert_index, slot)."""
    expert = jax.nn.one_hot(self.expert_index, self.num_experts, dtype=values.dtype)  # GSKE
    slot = jax.nn.one_hot(jnp.where(self.kept, self.slot, self.capacity), self.capacity, dtype=values.dtype)  # GSKC
    return jnp.einsum("GSK,GSKE,GSKC->GSEC", values, expert, slot)

  @property
  def combine_weights(self) -> jax.Array:
    """f32 [G, S, E, C]: g1 or g2 at each kept assignment's slot, else 0."""
    return self._dense(self.weight)

  @property
  def dispatch_mask(self) -> jax.Array:
    """bool [G, S, E, C]: the kept assignments."""
    return self._dense(self.kept.astype(jnp.float32)) > 0


def top2_gating(
    logits: jax.Array,
    expert_capacity: int,
    *,
    second_expert_policy: str = "all",
    second_expert_threshold: float = 0.5,
    rng: jax.Array | None = None,
    padding_mask: jax.Array | None = None,
    selection_bias: jax.Array | None = None,
) -> Routing:
  """Routes each group's tokens to their top-2 experts with capacity C.

  Args:
    logits: [G, S, E] router logits, any float dtype (the softmax runs in float32).
    expert_capacity: C, slots per expert per group.
    second_expert_policy: 'all' keeps every second choice; 'random' keeps it iff uniform < g2 / threshold.
    second_expert_threshold: the threshold of the 'random' policy (0.5 is the paper's `2 * g2 > uniform`).
    rng: PRNG key, required by the 'random' policy.
    padding_mask: [G, S], nonzero for real tokens; padded tokens are never dispatched and not counted.
    selection_bias: [E] added to the gates to choose e1 and e2, not to weigh them (moe.balance='bias').
  Returns:
    Routing; `.combine_weights` f32 [G, S, E, C] and `.dispatch_mask` bool [G, S, E, C] give the paper's tensors.
  """
  _check_gating_args(logits, expert_capacity, second_expert_policy, second_expert_threshold, rng, padding_mask)
  G, S, E = logits.shape
  C = expert_capacity
  logits = logits.astype(jnp.float32)
  gates = jax.nn.softmax(logits, axis=-1)  # GSE
  valid = jnp.ones((G, S), bool) if padding_mask is None else padding_mask.astype(bool)
  num_valid = jnp.maximum(valid.sum(axis=1, keepdims=True), 1).astype(jnp.float32)  # [G, 1]

  e1, e2, g1, g2 = top2_choices(gates, selection_bias)
  onehot1, onehot2 = jax.nn.one_hot(e1, E, dtype=jnp.int32), jax.nn.one_hot(e2, E, dtype=jnp.int32)  # GSE

  # Auxiliary loss on the top-1 choices, before any capacity drop.
  density = jnp.sum(onehot1 * valid[..., None], axis=1) / num_valid  # GE
  proxy = jnp.sum(gates * valid[..., None], axis=1) / num_valid  # GE
  aux_loss = jnp.mean(density * proxy) * E * E

  want2 = valid
  if second_expert_policy == "random":
    want2 = want2 & (jax.random.uniform(rng, (G, S)) < g2 / second_expert_threshold)
  mask1, pos1, mask2, pos2 = assign_slots(onehot1 * valid[..., None], onehot2 * want2[..., None], C)

  kept = jnp.stack([mask1.sum(-1), mask2.sum(-1)], axis=-1) > 0  # GSK
  slot = jnp.stack([jnp.sum(pos1 * onehot1, -1), jnp.sum(pos2 * onehot2, -1)], axis=-1).astype(jnp.int32)
  weight = jnp.stack([g1, g2], axis=-1) * kept

  total_valid = jnp.maximum(valid.sum(), 1).astype(jnp.float32)
  z_loss = jnp.sum(jax.nn.logsumexp(logits, axis=-1) ** 2 * valid) / total_valid
  experts = jnp.stack([e1, e2], axis=-1).astype(jnp.int32)
  metrics, requested = routing_metrics(gates, valid, jnp.stack([valid, want2], axis=-1), kept, experts)
  return Routing(
      expert_index=experts,
      slot=slot,
      weight=weight,
      kept=kept,
      aux_loss=aux_loss,
      z_loss=z_loss,
      metrics=metrics,
      num_experts=E,
      capacity=C,
      requested=requested,
  )


def top2_choices(gates: jax.Array,
                 bias: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """gates [G, S, E] -> (e1, e2 int [G, S], g1, g2 f32 [G, S]): the two best experts and their gates, normalised
  together (g1 + g2 = 1) before any capacity drop. `bias` [E] takes part in the choice only (DeepSeek-V3)."""
  scores = gates if bias is None else gates + bias
  e1 = jnp.argmax(scores, axis=-1)
  onehot1 = jax.nn.one_hot(e1, gates.shape[-1], dtype=gates.dtype)
  # Gates are >= 0, so -1 removes e1 from the second argmax even when the other gates underflow to 0 (a bias may
  # push scores below -1: -inf then).
  e2 = jnp.argmax(jnp.where(onehot1 > 0, -1.0 if bias is None else -jnp.inf, scores), axis=-1)
  g1 = jnp.take_along_axis(gates, e1[..., None], axis=-1)[..., 0]
  g2 = jnp.take_along_axis(gates, e2[..., None], axis=-1)[..., 0]
  denom = g1 + g2 + 1e-9
  return e1, e2, g1 / denom, g2 / denom


def assign_slots(want1: jax.Array, want2: jax.Array, capacity: int):
  """Buffer positions (Algorithm 1): want1, want2 int [G, S, E] one-hot wanted top-1 / top-2 assignments ->
  (kept1, pos1, kept2, pos2), each [G, S, E]. All top-1 assignments of a group come before any top-2 one, each in
  sequence order; a top-1 position counts the earlier tokens with the same expert (overflowed ones too), a top-2
  position follows that expert's kept top-1 assignments; positions >= capacity are dropped."""
  pos1 = jnp.cumsum(want1, axis=1) - want1  # exclusive: earlier tokens of the group with the same e1
  kept1 = want1 * (pos1 < capacity)
  pos2 = jnp.cumsum(want2, axis=1) - want2 + jnp.sum(kept1, axis=1, keepdims=True)
  kept2 = want2 * (pos2 < capacity)
  return kept1, pos1, kept2, pos2


def routing_metrics(gates, valid, wanted, kept, experts) -> tuple[dict, jax.Array]:
  """(metrics, requested) of any router's routing, from gates f32 [G, S, E], valid bool [G, S] (real tokens),
  wanted bool [G, S, K] (the assignments asked for: real tokens' choices, less second choices the 'random' policy
  declined), kept bool [G, S, K] and experts int [G, S, K]. requested int32 [E]: assignments asked of each expert
  before capacity (what moe.balance='bias' balances). The metrics, all f32:
    choices_wanted [K], choices_dropped [K]: per choice j (first, second, ...), the assignments asked for and those
      of them capacity dropped (`dropped_fractions` makes fractions of them);
    unrouted: the fraction of real tokens with no kept assignment; router_entropy: the gates' mean entropy;
    expert_load [E]: each expert's share of the kept assignments; requested_load [E]: its share of `requested`.
  """
  total = jnp.maximum(valid.sum(), 1).astype(jnp.float32)
  onehot = jax.nn.one_hot(experts, gates.shape[-1], dtype=jnp.int32)  # GSKE
  per_expert = jnp.sum(onehot * kept[..., None], axis=(0, 1, 2)).astype(jnp.float32)  # E
  requested = jnp.sum(onehot * wanted[..., None], axis=(0, 1, 2)).astype(jnp.int32)  # E
  entropy = -jnp.sum(gates * jnp.log(jnp.maximum(gates, 1e-30)), axis=-1)
  return {
      "choices_wanted": jnp.sum(wanted, axis=(0, 1)).astype(jnp.float32),
      "choices_dropped": jnp.sum(wanted & ~kept, axis=(0, 1)).astype(jnp.float32),
      "unrouted": jnp.sum(valid & ~kept.any(-1)) / total,
      "router_entropy": jnp.sum(entropy * valid) / total,
      "expert_load": per_expert / jnp.maximum(per_expert.sum(), 1.0),
      "requested_load": requested / jnp.maximum(requested.sum(), 1).astype(jnp.float32),
  }, requested


def dropped_fractions(metrics: dict) -> tuple[jax.Array, jax.Array]:
  """(first choices dropped, later choices dropped) of `routing_metrics`' metrics, as fractions of those asked for
  (0 where none were; later = 0 for one choice per token); any leading dimensions (e.g. the MoE layers [U])."""
  wanted, dropped = metrics["choices_wanted"], metrics["choices_dropped"]
  first = dropped[..., 0] / jnp.maximum(wanted[..., 0], 1.0)
  return first, dropped[..., 1:].sum(-1) / jnp.maximum(wanted[..., 1:].sum(-1), 1.0)


def _check_positive_int(name, value):
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
    raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_gating_args(logits, capacity, policy, threshold, rng, padding_mask):
  if logits.ndim != 3:
    raise ValueError(f"logits must be [G, S, E] (rank 3), got shape {tuple(logits.shape)}")
  if logits.shape[-1] < 2:
    raise ValueError(f"top-2 gating needs at least 2 experts, got E={logits.shape[-1]}")
  _check_positive_int("expert_capacity", capacity)
  if policy not in SECOND_EXPERT_POLICIES:
    raise ValueError(f"unknown second_expert_policy {policy!r}; expected one of {SECOND_EXPERT_POLICIES}")
  if policy == "random":
    if rng is None:
      raise ValueError("second_expert_policy='random' needs an rng")
    if not threshold > 0:
      raise ValueError(f"second_expert_threshold must be > 0, got {threshold!r}")
  if padding_mask is not None and tuple(padding_mask.shape) != tuple(logits.shape[:2]):
    raise ValueError(f"padding_mask must be [G, S] = {tuple(logits.shape[:2])}, got {tuple(padding_mask.shape)}")

"""GShard's gating (Algorithm 1, section 2.2) for any k, as pure functions: the one core of every top-k router,
and the `Routing` every router returns. Letters: G groups, S tokens per group, E experts, C capacity, K = k.

Lingvo's `Top2GatingOnLogits` rules, for any k: float32 softmax; the k best experts, best first (ties to the lower
index); gates normalised over the k chosen before any drop (Switch: the chosen gate itself); the 'random'
second-expert policy decided before any position; all first choices of a group placed before any second, each in
sequence order; positions >= C dropped; padding never dispatched nor counted.
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
from flax import struct

from gshard_mt.config.moe import SECOND_EXPERT_POLICIES


def expert_capacity(group_size: int, num_experts: int, capacity_factor: float, min_capacity: int = 4,
                    num_selected: int = 2) -> int:
  """C = max(min_capacity, ceil(capacity_factor * k * S / E)): the paper's 2N/E at factor 1.0 and k = 2."""
  for name, value in (("group_size", group_size), ("num_experts", num_experts), ("min_capacity", min_capacity),
                      ("num_selected", num_selected)):
    _check_positive_int(name, value)
  if not capacity_factor > 0:
    raise ValueError(f"capacity_factor must be > 0, got {capacity_factor!r}")
  return max(min_capacity, _ceil(capacity_factor * num_selected * group_size / num_experts))


def token_capacity(group_size: int, fraction: float) -> int:
  """C = ceil(fraction * S), at least 1: NLLB-MoE's evaluation capacity (moe_eval_capacity_token_fraction)."""
  return max(1, _ceil(fraction * group_size))


def _ceil(x: float) -> int:
  # Rounding first keeps 1.1 * 2 * 160 / 32 = 11.000000000000002 from becoming 12 (and 0.07 * 100 from 8).
  return math.ceil(round(x, 6))


def cap_logits(logits: jax.Array, cap: float) -> jax.Array:
  """Soft cap `cap * tanh(logits / cap)`; cap <= 0 means no cap. Any shape."""
  return logits if cap <= 0 else cap * jnp.tanh(logits / cap)


@struct.dataclass
class Routing:
  """Where each token goes, compactly; the dense GShard tensors are derived on demand.

  expert_index: int32 [G, S, K]  the expert of each assignment: e1, e2 for top-2 (moe.routers: other K).
  slot:         int32 [G, S, K]  buffer position c of each assignment (meaningful where `kept`).
  weight:       f32   [G, S, K]  normalised gates g1, g2; 0 where the assignment was dropped.
  kept:         bool  [G, S, K]  the assignment occupies a slot (< C) and survived the second-expert policy.
  aux_loss:     f32 []           load-balancing loss, mean(density * proxy) * E^2 (1.0 when balanced).
  z_loss:       f32 []           mean over real tokens of logsumexp(logits)^2.
  metrics:      dict of f32 (`routing_metrics`): the same keys for every router.
  requested:    int32 [E]     assignments asked of each expert before capacity (moe.balance='bias' balances it).
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


def topk_gating(logits: jax.Array, k: int, expert_capacity: int, *, normalize: bool = True,
                after_drops: bool = False, bias: jax.Array | None = None, padding_mask: jax.Array | None = None,
                second_expert_policy: str = "all", second_expert_threshold: float = 0.5,
                rng: jax.Array | None = None) -> Routing:
  """Routes each group's tokens to their top-k experts with capacity C -> Routing with K = k.

  Args:
    logits: [G, S, E] router logits, any float dtype (the softmax runs in float32).
    k: choices per token, 1 <= k <= E.
    expert_capacity: C, slots per expert per group (S: nothing is ever dropped).
    normalize: gates divided by their sum over the k chosen (GShard); False keeps the softmax value (Switch).
    after_drops: with normalize, the kept gates divided by their sum after capacity drops (NLLB-MoE's
      normalize_router_prob_before_dropping=False: a token that keeps one expert weighs it by 1).
    bias: [E] added to the gates to choose the experts, not to weigh them (moe.balance='bias'), or None.
    padding_mask: [G, S], nonzero for real tokens.
    second_expert_policy: 'all', or 'random': keep a second choice iff uniform < g2 / threshold, decided before
      any position (0.5 is the paper's `2 * g2 > uniform`); needs k >= 2 and rng.
  """
  _check_gating_args(logits, k, expert_capacity, second_expert_policy, second_expert_threshold, rng, padding_mask)
  G, S, E = logits.shape
  logits = logits.astype(jnp.float32)
  gates = jax.nn.softmax(logits, axis=-1)  # GSE
  valid = jnp.ones((G, S), bool) if padding_mask is None else padding_mask.astype(bool)
  # Every choice in arrays of its own ([G, S] and [G, S, E]), stacked into [G, S, K] once at the end: a TPU pads
  # [.., K] and [.., K, E] intermediates in its tiled minor dimensions (docs/decisions.md, "One top-k gating core").
  experts, weight = choices_of(gates, k, bias)
  if normalize and not after_drops:
    weight = normalized(weight)
  wanted = [valid] * k
  if second_expert_policy == "random":
    wanted[1] = valid & (jax.random.uniform(rng, (G, S)) < weight[1] / second_expert_threshold)
  onehot = [jax.nn.one_hot(e, E, dtype=jnp.int32) for e in experts]  # K x GSE
  kept_e, position = assign_slots([o * w[..., None] for o, w in zip(onehot, wanted)], expert_capacity)
  kept = [jnp.sum(o, axis=-1) > 0 for o in kept_e]
  slot = [jnp.sum(p * o, axis=-1).astype(jnp.int32) for p, o in zip(position, onehot)]
  aux_loss, z_loss = balance_losses(logits, gates, onehot[0], valid)
  stack = functools.partial(jnp.stack, axis=-1)  # K arrays [G, S] -> [G, S, K]
  experts_k, kept_k = stack(experts), stack(kept)
  metrics, requested = routing_metrics(gates, valid, stack(wanted), kept_k, experts_k)
  weight = [w * c for w, c in zip(weight, kept)]
  if normalize and after_drops:
    weight = renormalized(weight)
  return Routing(expert_index=experts_k, slot=stack(slot), weight=stack(weight),
                 kept=kept_k, aux_loss=aux_loss, z_loss=z_loss, metrics=metrics, num_experts=E,
                 capacity=expert_capacity, requested=requested)


def top2_gating(logits: jax.Array, expert_capacity: int, **options) -> Routing:
  """GShard's top-2 (Algorithm 1): `topk_gating` with k = 2 and the same keyword options."""
  return topk_gating(logits, 2, expert_capacity, **options)


def choices_of(gates: jax.Array, k: int, bias: jax.Array | None = None) -> tuple[list, list]:
  """gates [G, S, E] -> (experts, their gates): per choice, best first, int32 [G, S] and f32 [G, S]. `bias` [E]
  takes part in the choice only: the experts are the top k of gates + bias, their gates the plain ones."""
  # k argmaxes, not jax.lax.top_k: XLA lowers TopK on [G*S, E] rows, and with G split over devices the reshape
  # all-gathers every group's gates (tests/integration/test_partitioning.py counts the collectives)
  scores, experts = gates if bias is None else gates + bias, []
  for _ in range(k):
    best = jnp.argmax(scores, axis=-1)  # ties: the lower index first, as top_k
    experts.append(best.astype(jnp.int32))
    scores = jnp.where(jax.nn.one_hot(best, gates.shape[-1], dtype=bool), -jnp.inf, scores)
  return experts, [jnp.take_along_axis(gates, e[..., None], axis=-1)[..., 0] for e in experts]


def normalized(weights: list[jax.Array]) -> list[jax.Array]:
  """Per choice, the gates [G, S] divided by their sum + 1e-9 (GShard's g1 / (g1 + g2 + 1e-9))."""
  denom = sum(weights) + 1e-9
  return [w / denom for w in weights]


def renormalized(weights: list[jax.Array]) -> list[jax.Array]:
  """Per choice, the kept gates [G, S] divided by their sum, at least float32's eps (NLLB-MoE's clamp): 0 where
  nothing was kept."""
  denom = jnp.maximum(sum(weights), jnp.finfo(jnp.float32).eps)
  return [w / denom for w in weights]


def assign_slots(want: list[jax.Array], capacity: int) -> tuple[list[jax.Array], list[jax.Array]]:
  """want: per choice, int [G, S, E] one-hot wanted assignments -> (kept, position): per choice, int [G, S, E].

  Choice j of a token takes the position (earlier tokens of the group wanting that expert as their choice j) +
  (the expert's kept assignments of choices before j); positions >= capacity are dropped (GShard's priority).
  """
  kept, position, earlier = [], [], 0
  for w in want:  # GSE
    pos = jnp.cumsum(w, axis=1) - w + earlier  # exclusive cumsum: overflowed tokens count too, as in GShard
    kept.append(w * (pos < capacity))
    position.append(pos)
    earlier = earlier + jnp.sum(kept[-1], axis=1, keepdims=True)  # [G, 1, E]
  return kept, position


def balance_losses(logits, gates, first_choice, valid) -> tuple[jax.Array, jax.Array]:
  """(aux, z): GShard's (= Switch's) load-balancing loss on the first choices before any drop, mean over groups of
  E * sum_e density_e * proxy_e (1.0 when balanced; a group of padding only counts 0, as in GShard's code), and the
  z-loss over real tokens. logits, gates f32 [G, S, E]; first_choice int one-hot [G, S, E]; valid bool [G, S]."""
  E = gates.shape[-1]
  num_valid = jnp.maximum(valid.sum(axis=1, keepdims=True), 1).astype(jnp.float32)  # [G, 1]
  density = jnp.sum(first_choice * valid[..., None], axis=1) / num_valid  # GE
  proxy = jnp.sum(gates * valid[..., None], axis=1) / num_valid  # GE
  total = jnp.maximum(valid.sum(), 1).astype(jnp.float32)
  z_loss = jnp.sum(jax.nn.logsumexp(logits, axis=-1) ** 2 * valid) / total
  return jnp.mean(density * proxy) * E * E, z_loss


def routing_metrics(gates, valid, wanted, kept, experts) -> tuple[dict, jax.Array]:
  """(metrics, requested int32 [E]) of any router's routing, from gates f32 [G, S, E], valid bool [G, S] (real
  tokens), wanted bool [G, S, K] (the assignments asked for, before capacity), kept bool [G, S, K] and experts int
  [G, S, K]. The metrics, all f32:
    choices_wanted [K], choices_dropped [K]: per choice j, the assignments asked for and those capacity dropped;
    unrouted: the fraction of real tokens with no kept assignment; router_entropy: the gates' mean entropy;
    expert_load [E]: each expert's share of the kept assignments; requested_load [E]: its share of `requested`;
    real_tokens, kept_assignments, asked_assignments: what those means and shares are of (`merge_metrics`).
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
      "real_tokens": valid.sum().astype(jnp.float32),
      "kept_assignments": per_expert.sum(),
      "asked_assignments": requested.sum().astype(jnp.float32),
  }, requested


def merge_metrics(metrics: dict) -> dict:
  """`routing_metrics`' metrics of K microbatches stacked on a leading axis [K, ...] -> the whole batch's: counts
  summed, each mean or share weighted by the count it is taken over (a mean of the K means would weigh a
  microbatch of few real tokens as much as a full one)."""
  weight_of = {"unrouted": "real_tokens", "router_entropy": "real_tokens", "expert_load": "kept_assignments",
               "requested_load": "asked_assignments"}
  return {name: weighted_mean(value, metrics[weight_of[name]]) if name in weight_of else jnp.sum(value, axis=0)
          for name, value in metrics.items()}


def weighted_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
  """values [K, ...] averaged over K, weighted by weights [K, ...] (their leading dimensions; 0 where all are 0)."""
  weights = weights.reshape(weights.shape + (1,) * (values.ndim - weights.ndim))
  return jnp.sum(values * weights, axis=0) / jnp.maximum(jnp.sum(weights, axis=0), 1.0)


def dropped_fractions(metrics: dict) -> tuple[jax.Array, jax.Array]:
  """(first, later) choices dropped, as fractions of those asked for (0 where none were), from `routing_metrics`'
  metrics with any leading dimensions (e.g. the MoE layers [U])."""
  wanted, dropped = metrics["choices_wanted"], metrics["choices_dropped"]
  first = dropped[..., 0] / jnp.maximum(wanted[..., 0], 1.0)
  return first, dropped[..., 1:].sum(-1) / jnp.maximum(wanted[..., 1:].sum(-1), 1.0)


def _check_positive_int(name, value):
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
    raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_gating_args(logits, k, capacity, policy, threshold, rng, padding_mask):
  if logits.ndim != 3:
    raise ValueError(f"logits must be [G, S, E] (rank 3), got shape {tuple(logits.shape)}")
  _check_positive_int("k", k)
  if k > logits.shape[-1]:
    raise ValueError(f"top-{k} gating needs at least {k} experts, got E={logits.shape[-1]}")
  _check_positive_int("expert_capacity", capacity)
  if policy not in SECOND_EXPERT_POLICIES:
    raise ValueError(f"unknown second_expert_policy {policy!r}; expected one of {SECOND_EXPERT_POLICIES}")
  if policy == "random":
    if rng is None:
      raise ValueError("second_expert_policy='random' needs an rng")
    if not threshold > 0:
      raise ValueError(f"second_expert_threshold must be > 0, got {threshold!r}")
    if k < 2:
      raise ValueError(f"second_expert_policy='random' needs a second choice, got k={k}")
  if padding_mask is not None and tuple(padding_mask.shape) != tuple(logits.shape[:2]):
    raise ValueError(f"padding_mask must be [G, S] = {tuple(logits.shape[:2])}, got {tuple(padding_mask.shape)}")

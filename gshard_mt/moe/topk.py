"""Top-k gating with capacity, GShard's rules for any k, as pure functions (the `switch`, `topk`, `dropless` and
`language` routers).

Letters: G groups, S tokens per group, E experts, C capacity (slots per expert per group), K = k choices.
GShard's Algorithm 1 generalised: float32 softmax; the k best experts, best first (ties to the lower index);
gates normalised over the k chosen before any drop (or, as the Switch Transformer, the chosen gate itself);
every first choice of a group placed before any second choice, every second before any third, each in sequence
order; positions >= C dropped; padding never dispatched nor counted. With k = 2 this is `gating.top2_gating` with
the 'all' second-expert policy (tested).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gshard_mt.moe.gating import Routing, routing_metrics


def topk_choices(gates: jax.Array, k: int, bias: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """gates [G, S, E] -> (experts int32 [G, S, K], their gates f32 [G, S, K]), best first.

  `bias` [E] (DeepSeek-V3's auxiliary-loss-free balancing) takes part in the choice only: the experts are the top
  k of gates + bias, their gates are the plain ones.
  """
  _, experts = jax.lax.top_k(gates if bias is None else gates + bias, k)  # ties: the lower index first
  return experts.astype(jnp.int32), jnp.take_along_axis(gates, experts, axis=-1)


def assign_slots(want: jax.Array, capacity: int) -> tuple[jax.Array, jax.Array]:
  """want int [G, S, K, E] one-hot wanted assignments -> (kept, position), each int [G, S, K, E].

  Choice j of a token takes the position (earlier tokens of the group wanting that expert as their choice j) +
  (the expert's kept assignments of choices before j); positions >= capacity are dropped (GShard's priority).
  """
  kept, position, earlier = [], [], 0
  for j in range(want.shape[2]):
    w = want[:, :, j]  # GSE
    pos = jnp.cumsum(w, axis=1) - w + earlier  # exclusive cumsum: overflowed tokens count too, as in GShard
    kept.append(w * (pos < capacity))
    position.append(pos)
    earlier = earlier + jnp.sum(kept[-1], axis=1, keepdims=True)  # [G, 1, E]
  return jnp.stack(kept, axis=2), jnp.stack(position, axis=2)


def topk_gating(logits: jax.Array, k: int, expert_capacity: int, *, normalize: bool = True,
                bias: jax.Array | None = None, padding_mask: jax.Array | None = None) -> Routing:
  """Routes each group's tokens to their top-k experts with capacity C.

  Args:
    logits: [G, S, E] router logits, any float dtype (the softmax runs in float32).
    k: choices per token, 1 <= k <= E.
    expert_capacity: C, slots per expert per group (S: nothing is ever dropped).
    normalize: gates divided by their sum over the k chosen (GShard); False keeps the softmax value (Switch).
    bias: [E] selection-only bias (see `topk_choices`), or None.
    padding_mask: [G, S], nonzero for real tokens.
  Returns:
    Routing with K = k.
  """
  G, S, E = logits.shape
  if not 1 <= k <= E:
    raise ValueError(f"k={k}: expected 1 <= k <= E={E}")
  logits = logits.astype(jnp.float32)
  gates = jax.nn.softmax(logits, axis=-1)  # GSE
  valid = jnp.ones((G, S), bool) if padding_mask is None else padding_mask.astype(bool)
  experts, weight = topk_choices(gates, k, bias)  # GSK
  if normalize:
    weight = weight / (sum(weight[..., j] for j in range(k)) + 1e-9)[..., None]  # as GShard's g1 + g2 + 1e-9
  onehot = jax.nn.one_hot(experts, E, dtype=jnp.int32)  # GSKE
  kept_e, position = assign_slots(onehot * valid[..., None, None], expert_capacity)
  kept = jnp.sum(kept_e, axis=-1) > 0  # GSK
  aux_loss, z_loss = balance_losses(logits, gates, onehot[:, :, 0], valid)
  metrics, requested = routing_metrics(gates, valid, jnp.broadcast_to(valid[..., None], kept.shape), kept, experts)
  return Routing(expert_index=experts, slot=jnp.sum(position * onehot, axis=-1).astype(jnp.int32),
                 weight=weight * kept, kept=kept, aux_loss=aux_loss, z_loss=z_loss, metrics=metrics, num_experts=E,
                 capacity=expert_capacity, requested=requested)


def balance_losses(logits, gates, first_choice, valid) -> tuple[jax.Array, jax.Array]:
  """(aux, z): GShard's (= the Switch Transformer's) load-balancing loss on the first choices before any drop,
  mean over groups of E * sum_e density_e * proxy_e (1.0 when balanced), and the z-loss over real tokens.
  logits, gates f32 [G, S, E]; first_choice int one-hot [G, S, E]; valid bool [G, S]."""
  E = gates.shape[-1]
  num_valid = jnp.maximum(valid.sum(axis=1, keepdims=True), 1).astype(jnp.float32)  # [G, 1]
  density = jnp.sum(first_choice * valid[..., None], axis=1) / num_valid  # GE
  proxy = jnp.sum(gates * valid[..., None], axis=1) / num_valid  # GE
  total = jnp.maximum(valid.sum(), 1).astype(jnp.float32)
  z_loss = jnp.sum(jax.nn.logsumexp(logits, axis=-1) ** 2 * valid) / total
  return jnp.mean(density * proxy) * E * E, z_loss

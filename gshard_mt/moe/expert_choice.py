"""Expert-choice routing (Zhou et al. 2022, "Mixture-of-Experts with Expert Choice Routing"), a pure function.

Letters: G groups, S tokens per group, E experts, C capacity. Each expert takes the C tokens of its group with the
highest softmax score p[:, e] (section 3.1), weighted by p, not renormalised; a token may get several experts or
none, every buffer is full (equal loads: aux_loss is 0). An expert ranks later positions too: not causal, so the
encoder's only. In the Routing, K = E: assignment (g, s, e) is "expert e took token s", at slot = its rank.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gshard_mt.moe.gating import Routing, balance_losses, routing_metrics


def expert_choice_gating(logits: jax.Array, expert_capacity: int, *,
                         padding_mask: jax.Array | None = None) -> Routing:
  """logits [G, S, E] -> Routing ([G, S, E] fields): each expert's top-C real tokens of each group, C <= S.

  Padded tokens are never taken (an expert of a group with fewer than C real tokens keeps slots empty).
  """
  G, S, E = logits.shape
  C = expert_capacity
  if not 1 <= C <= S:
    raise ValueError(f"expert_capacity={C}: expert choice takes 1 to S={S} tokens per expert")
  logits = logits.astype(jnp.float32)
  gates = jax.nn.softmax(logits, axis=-1)  # GSE
  valid = jnp.ones((G, S), bool) if padding_mask is None else padding_mask.astype(bool)
  # Padded tokens score below every real one (gates >= 0), so they come last in each expert's ranking.
  scores = jnp.where(valid[..., None], gates, -1.0).transpose(0, 2, 1)  # GES
  _, tokens = jax.lax.top_k(scores, C)  # GEC: the tokens each expert takes, best first (ties: lower position)
  g, e = jnp.meshgrid(jnp.arange(G), jnp.arange(E), indexing="ij")
  rank = jnp.full((G, E, S), C, jnp.int32).at[g[..., None], e[..., None], tokens].set(
      jnp.arange(C, dtype=jnp.int32))  # GES: slot of each token in each expert's buffer, C if not taken
  slot = rank.transpose(0, 2, 1)  # GSE
  kept = (slot < C) & valid[..., None]
  experts = jnp.broadcast_to(jnp.arange(E, dtype=jnp.int32), (G, S, E))
  _, z_loss = balance_losses(logits, gates, jnp.zeros((G, S, E), jnp.int32), valid)
  metrics, requested = routing_metrics(gates, valid, kept, kept, experts)  # an expert asks for what it takes
  # One "choice" per token: dropped where no expert took it.
  metrics |= {"choices_wanted": jnp.sum(valid).astype(jnp.float32)[None],
              "choices_dropped": jnp.sum(valid & ~kept.any(-1)).astype(jnp.float32)[None]}
  return Routing(expert_index=experts, slot=jnp.where(kept, slot, 0), weight=gates * kept, kept=kept,
                 aux_loss=jnp.zeros((), jnp.float32), z_loss=z_loss, metrics=metrics, num_experts=E, capacity=C,
                 requested=requested)

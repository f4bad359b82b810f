"""The GShard MoE feed-forward layer (Algorithm 2): parameters wired to the pure parts, `routers`, `experts` (one
class per moe.dispatch) and `balance`. Parameters and key activations carry logical axis names (`axes`).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from gshard_mt.config.moe import MoeConfig
from gshard_mt.moe import balance, experts, ffn, gating, routers
from gshard_mt.moe.axes import EHM, EMH, GSM, ME, ZHM, ZMH
from gshard_mt.moe.experts import ACTIVATIONS
from gshard_mt.ops import Ops

ROUTING = "routing"  # the collection where each token went: read by tools.expert_usage, never written while training
EXPERT_INIT = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=1, out_axis=2,
                                               batch_axis=(0,))


def groups_of(num_tokens: int, group_size: int, pad: bool = False) -> tuple[int, int]:
  """(G, S) for `num_tokens` tokens in groups of `group_size` (fewer tokens: one group). S not dividing the
  tokens is an error, or with pad=True one more group (the caller pads it with masked tokens)."""
  if num_tokens <= group_size:
    return 1, num_tokens
  if num_tokens % group_size and not pad:
    raise ValueError(
        f"moe.group_size={group_size} does not divide the {num_tokens} tokens of the batch (batch x length); "
        "choose a group size that divides batch_size * max_length")
  return -(-num_tokens // group_size), group_size


def in_groups(a: jax.Array, G: int, S: int) -> jax.Array:
  """[B, L, M] -> [G, S, M], the last group padded with zeros."""
  M = a.shape[-1]
  flat = a.reshape(-1, M)
  return nn.with_logical_constraint(jnp.pad(flat, ((0, G * S - flat.shape[0]), (0, 0))).reshape(G, S, M), GSM)


def group_mask(padding_mask: jax.Array | None, num_tokens: int, G: int, S: int) -> jax.Array:
  """padding_mask [B, L] (nonzero for real tokens; None: all) -> bool [G, S], the padding of the last group masked."""
  mask = jnp.ones((num_tokens,), bool) if padding_mask is None else padding_mask.reshape(num_tokens).astype(bool)
  return jnp.pad(mask, (0, G * S - num_tokens)).reshape(G, S)


def shared_ffn(x: jax.Array, wi: jax.Array, wo: jax.Array, activation: str = "relu") -> jax.Array:
  """The Z shared experts (DeepSeekMoE), which every token passes through: x [G, S, M] x wi [Z, M, H] x
  wo [Z, H, M] -> the sum of the Z expert outputs [G, S, M]."""
  h = nn.with_logical_constraint(ACTIVATIONS[activation](jnp.einsum("GSM,ZMH->GSZH", x, wi)),
                                 ("group", None, None, "mlp"))
  return jnp.einsum("GSZH,ZHM->GSM", h, wo)


class MoeFeedForward(nn.Module):
  """MoE FFN with the router of `cfg`; stats = {'aux_loss', 'z_loss', 'metrics'}, which the training loop weighs
  into its loss and logs. deterministic=True: the evaluation capacity factor, no noise nor random routing, and a
  token count that S does not divide (a last evaluation batch, beams) padded instead of an error. With
  moe.balance='bias', while training, it writes the assignments asked of each expert to the 'balance' collection.
  Where the 'routing' collection (ROUTING) is mutable, it writes the routing's expert_index and kept [G, S, K] and
  the token mask [G, S] there.
  """

  cfg: MoeConfig
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  decoder: bool = False  # routes with moe.decoder_router
  ops: Ops = Ops()  # the optional kernels the run picked (the experts' FFN, the grouped matmuls)

  @nn.compact
  def __call__(self, x: jax.Array, padding_mask: jax.Array | None = None, *, deterministic: bool = True,
               language: jax.Array | None = None):
    """x [B, L, M], padding_mask [B, L] (nonzero: real), language [B, L, M] (the embedding of each token's
    source-language tag, for moe.router='language') -> (y [B, L, M], stats); routed in G groups of S."""
    cfg = self.cfg  # checked with the config (training.validate)
    router = routers.make_router(cfg, decoder=self.decoder, deterministic=deterministic)
    if router.reads_language and language is None:
      raise ValueError("moe.router='language' routes by the source language: pass each token's `language`")
    B, L, M = x.shape
    E, H = cfg.num_experts, cfg.hidden_dim
    G, S = groups_of(B * L, cfg.group_size, pad=deterministic)
    wg = self.param("wg", nn.with_logical_partitioning(nn.initializers.lecun_normal(), ME), (M, E), jnp.float32)
    wi = self.param("wi", nn.with_logical_partitioning(EXPERT_INIT, EMH), (E, M, H), self.param_dtype)
    wo = self.param("wo", nn.with_logical_partitioning(EXPERT_INIT, EHM), (E, H, M), self.param_dtype)
    x = in_groups(x, G, S)
    # Task-level routing reads the sentence's language, the same for all its tokens (Kudugunta et al., section 3).
    router_in = in_groups(language, G, S) if router.reads_language else x
    mask = group_mask(padding_mask, B * L, G, S)
    logits = gating.cap_logits(jnp.einsum("GSM,ME->GSE", self._jittered(router_in, deterministic), wg),
                               cfg.router_logit_cap)  # the router's logits over the E experts
    routing = self._route(router, logits, mask, deterministic)
    if self.is_mutable_collection(ROUTING) and not self.is_initializing():  # init makes every collection mutable
      for name, value in (("expert_index", routing.expert_index), ("kept", routing.kept), ("mask", mask)):
        self.put_variable(ROUTING, name, value)
    x = x.astype(self.dtype)
    training = cfg.expert_dropout and not deterministic
    output = ffn.output_dropout(cfg.expert_dropout, self.make_rng("dropout") if training else None)
    y = experts.expert_path(cfg, self.dtype, self.ops, output)(x, routing, self._weights(wi, wo))
    if cfg.shared_experts:
      Z = cfg.shared_experts
      shared_wi = self.param("shared_wi", nn.with_logical_partitioning(EXPERT_INIT, ZMH), (Z, M, H), self.param_dtype)
      shared_wo = self.param("shared_wo", nn.with_logical_partitioning(EXPERT_INIT, ZHM), (Z, H, M), self.param_dtype)
      y = y + shared_ffn(x, shared_wi.astype(self.dtype), shared_wo.astype(self.dtype), cfg.activation)
    stats = {"aux_loss": routing.aux_loss, "z_loss": routing.z_loss, "metrics": routing.metrics}
    return y.reshape(G * S, M)[: B * L].reshape(B, L, M), stats

  def _weights(self, wi: jax.Array, wo: jax.Array) -> ffn.ExpertWeights:
    """The experts' weights, with their biases bi [E, H], bo [E, M] where moe.expert_bias asks for them."""
    if not self.cfg.expert_bias:
      return ffn.ExpertWeights(wi, wo)
    E, M, H = wi.shape
    bias = lambda name, shape, axes: self.param(  # noqa: E731
        name, nn.with_logical_partitioning(nn.initializers.zeros, axes), shape, self.param_dtype)
    return ffn.ExpertWeights(wi, wo, bias("bi", (E, H), (EMH[0], EMH[2])), bias("bo", (E, M), (EHM[0], EHM[2])))

  def _jittered(self, router_in: jax.Array, deterministic: bool) -> jax.Array:
    """The router's input [G, S, M] in float32, times uniform noise in [1 - eps, 1 + eps] while training."""
    router_in = router_in.astype(jnp.float32)
    eps = self.cfg.jitter_noise
    if deterministic or eps <= 0:
      return router_in
    return router_in * jax.random.uniform(self.make_rng("gating"), router_in.shape, jnp.float32, 1.0 - eps, 1.0 + eps)

  def _route(self, router, logits: jax.Array, mask: jax.Array | None, deterministic: bool) -> gating.Routing:
    """The router's logits [G, S, E] -> its routing, with moe.balance='bias' biased."""
    cfg = self.cfg
    bias = None
    if cfg.balance == "bias":
      bias = self.param(balance.NAME, nn.with_logical_partitioning(nn.initializers.zeros, (None,)),
                        (cfg.num_experts,), jnp.float32)
    capacity = self._capacity(router, logits.shape[1], deterministic)
    routing = router.route(logits, capacity, padding_mask=mask,
                           rng=self.make_rng("gating") if router.needs_rng else None,
                           bias=None if bias is None else jax.lax.stop_gradient(bias))  # chooses, never trained
    if bias is not None and not deterministic and self.is_mutable_collection(balance.COLLECTION):
      self.put_variable(balance.COLLECTION, balance.NAME, routing.requested)  # the train step moves the bias
    return routing

  def _capacity(self, router, group_size: int, deterministic: bool) -> int:
    """C of a group of S tokens: NLLB-MoE's rules where the config gives them (a fixed C while training, a share of
    S in evaluation), else the router's from the capacity factor."""
    cfg = self.cfg
    if deterministic and cfg.eval_capacity_fraction:
      return gating.token_capacity(group_size, cfg.eval_capacity_fraction)
    if not deterministic and cfg.train_capacity:
      return cfg.train_capacity
    factor = cfg.eval_capacity_factor if deterministic else cfg.train_capacity_factor
    return router.capacity(group_size, cfg.num_experts, factor, cfg.min_capacity)

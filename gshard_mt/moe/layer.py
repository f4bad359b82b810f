"""The GShard MoE feed-forward layer (Algorithm 2): router, gating, dispatch, expert FFNs, combine.

The module only wires parameters to the pure functions of `routers` (GShard's top-2 and the others), `dispatch`,
`expert_ffn` and `grouped` (the experts on rows in blocks by expert). Every parameter and the key activations
carry logical axis names; `gshard_mt.partitioning` maps them onto mesh axes.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from gshard_mt.config.moe import MoeConfig
from gshard_mt.moe import balance, gating, grouped, manual, routers
from gshard_mt.moe import dispatch as dispatch_lib
from gshard_mt.parallel.einsum import weight_einsum

ACTIVATIONS = {"relu": jax.nn.relu, "gelu": jax.nn.gelu}  # keys: config.moe.ACTIVATIONS (tested)

# Logical axis names of the layer's tensors (G, S, E, C, M, H in the paper's letters).
ME = ("embed", None)  # the router
GSM = ("group", None, "embed")
GSE = ("group", None, None)  # router logits
GSEC = ("group", None, None, None)  # dispatch mask and combine weights
EGCM = ("expert", "group", "capacity", "embed")
EGCH = ("expert", "group", "capacity", "mlp")
# The combine input is sharded by groups only: naming E here would let E keep the 'expert' mesh axis (the rules
# give it priority) and the E -> G all-to-all would not happen.
EGCM_BY_GROUP = (None, "group", "capacity", "embed")
EMH = ("expert", "embed", "mlp")
EHM = ("expert", "mlp", "embed")
ZMH, ZHM = (None, "embed", "mlp"), (None, "mlp", "embed")  # the Z shared experts


def expert_ffn(expert_in: jax.Array, wi: jax.Array, wo: jax.Array, activation: str = "relu",
               constrain: bool = True) -> jax.Array:
  """Each expert's FFN on its buffers: [E, G, C, M] x wi [E, M, H] x wo [E, H, M] -> [E, G, C, M].

  The output stays E-sharded here; the caller's constraint to EGCM_BY_GROUP is the E -> G all-to-all (producing
  G-sharded buffers in the einsum itself lets XLA all-gather wo instead). constrain=False leaves out the sharding
  constraints (inside shard_map, where each device sees its own shards).
  """
  h = ACTIVATIONS[activation](weight_einsum("EGCM,EMH->EGCH", expert_in, wi))
  h = nn.with_logical_constraint(h, EGCH if constrain else None)
  return nn.with_logical_constraint(weight_einsum("EGCH,EHM->EGCM", h, wo), EGCM if constrain else None)


def groups_of(num_tokens: int, group_size: int, pad: bool = False) -> tuple[int, int]:
  """(G, S) for `num_tokens` tokens in groups of `group_size`; fewer tokens than S make one group.

  When S does not divide the tokens: an error, or with pad=True enough groups to hold them all (the caller pads
  the last group with masked tokens).
  """
  if num_tokens <= group_size:
    return 1, num_tokens
  if num_tokens % group_size and not pad:
    raise ValueError(
        f"moe.group_size={group_size} does not divide the {num_tokens} tokens of the batch (batch x length); "
        "choose a group size that divides batch_size * max_length")
  return -(-num_tokens // group_size), group_size


def shared_ffn(x: jax.Array, wi: jax.Array, wo: jax.Array, activation: str = "relu") -> jax.Array:
  """The Z shared experts (DeepSeekMoE), which every token passes through: x [G, S, M] x wi [Z, M, H] x
  wo [Z, H, M] -> the sum of the Z expert outputs [G, S, M]."""
  h = nn.with_logical_constraint(ACTIVATIONS[activation](jnp.einsum("GSM,ZMH->GSZH", x, wi)),
                                 ("group", None, None, "mlp"))
  return jnp.einsum("GSZH,ZHM->GSM", h, wo)


class MoeFeedForward(nn.Module):
  """MoE FFN with the router of `cfg` (GShard's top-2 by default). Call with x [B, L, M] (and padding_mask [B, L],
  nonzero for real tokens; language [B, L, M] for moe.router='language').

  Returns (y [B, L, M], stats) where stats = {'aux_loss', 'z_loss', 'metrics'}: the training loop adds
  aux_loss_weight * sum(aux_loss) (+ z_loss_weight * sum(z_loss)) to its loss and logs the metrics.
  With deterministic=True the evaluation capacity factor is used, no noise or random routing is applied (the
  'random' second-expert policy becomes 'all'), and a token count that S does not divide (a last evaluation
  batch, beams while decoding) is padded with masked tokens instead of being an error.
  With moe.balance='bias' the layer has a selection bias (`balance`); while training, when the 'balance'
  collection is mutable, it writes there the assignments its router asked of each expert (int [E], before
  capacity), by which the train step moves the bias once per step.
  """

  cfg: MoeConfig
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  decoder: bool = False  # routes with moe.decoder_router
  kernel_vmem: int | None = None  # moe.expert_kernel='pallas': the TPU's VMEM in bytes (None: not known)

  @nn.compact
  def __call__(self, x: jax.Array, padding_mask: jax.Array | None = None, *, deterministic: bool = True,
               language: jax.Array | None = None):
    """x [B, L, M], padding_mask [B, L], language [B, L, M] (the embedding of each token's source-language tag)
    -> (y [B, L, M], stats); tokens are routed in G groups of S."""
    cfg = self.cfg.validate()
    router = routers.make_router(cfg, decoder=self.decoder, deterministic=deterministic)
    if router.reads_language and language is None:
      raise ValueError("moe.router='language' routes by the source language: pass each token's `language`")
    B, L, M = x.shape
    E, H = cfg.num_experts, cfg.hidden_dim
    G, S = groups_of(B * L, cfg.group_size, pad=deterministic)
    pad = G * S - B * L
    wg = self.param("wg", nn.with_logical_partitioning(nn.initializers.lecun_normal(), ME),
                    (M, E), jnp.float32)
    expert_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=1, out_axis=2,
                                                   batch_axis=(0,))
    wi = self.param("wi", nn.with_logical_partitioning(expert_init, EMH), (E, M, H), self.param_dtype)
    wo = self.param("wo", nn.with_logical_partitioning(expert_init, EHM), (E, H, M), self.param_dtype)

    def in_groups(a):  # [B, L, M] -> [G, S, M], the last group padded
      return nn.with_logical_constraint(jnp.pad(a.reshape(B * L, M), ((0, pad), (0, 0))).reshape(G, S, M), GSM)

    x = in_groups(x)
    mask = None if padding_mask is None else padding_mask.reshape(B * L)
    if pad:
      mask = jnp.pad(jnp.ones((B * L,), bool) if mask is None else mask.astype(bool), (0, pad))
    mask = None if mask is None else mask.reshape(G, S)
    # Task-level routing reads the sentence's language, the same for all its tokens (Kudugunta et al., section 3).
    router_in = (in_groups(language) if router.reads_language else x).astype(jnp.float32)
    if not deterministic and cfg.jitter_noise > 0:
      eps = cfg.jitter_noise
      router_in = router_in * jax.random.uniform(self.make_rng("gating"), router_in.shape, jnp.float32,
                                                 1.0 - eps, 1.0 + eps)
    logits = gating.cap_logits(jnp.einsum("GSM,ME->GSE", router_in, wg), cfg.router_logit_cap)

    bias = None
    if cfg.balance == "bias":
      bias = self.param(balance.NAME, nn.with_logical_partitioning(nn.initializers.zeros, (None,)), (E,),
                        jnp.float32)
    factor = cfg.eval_capacity_factor if deterministic else cfg.train_capacity_factor
    routing = router.route(logits, router.capacity(S, E, factor, cfg.min_capacity), padding_mask=mask,
                           rng=self.make_rng("gating") if router.needs_rng else None,
                           bias=None if bias is None else jax.lax.stop_gradient(bias))  # chooses, never trained
    if bias is not None and not deterministic and self.is_mutable_collection(balance.COLLECTION):
      self.put_variable(balance.COLLECTION, balance.NAME, routing.requested)  # the train step moves the bias

    x = x.astype(self.dtype)
    if cfg.dispatch == "grouped":  # takes the weights in param_dtype (their gradients stay in it)
      dispatcher = dispatch_lib.GroupedDispatcher(routing)
      kernels = grouped.kernels_for(cfg.grouped_kernel, M, H, self.dtype)
      rows = grouped.grouped_expert_ffn(dispatcher.dispatch(x), dispatcher.group_sizes, wi, wo,
                                        ACTIVATIONS[cfg.activation], kernels)
      y = nn.with_logical_constraint(dispatcher.combine(rows), GSM)
    elif cfg.dispatch == "shard_map":
      y = manual.moe_shard_map(x, routing, wi.astype(self.dtype), wo.astype(self.dtype),
                               functools.partial(expert_ffn, activation=cfg.activation, constrain=False),
                               group_spec=nn.logical_to_mesh_axes(GSM), expert_spec=nn.logical_to_mesh_axes(EMH))
    else:  # the float32 weights as they are: weight_einsum casts them, and keeps their gradients float32
      dispatcher = dispatch_lib.make_dispatcher(cfg.dispatch, routing)
      if cfg.expert_kernel == "pallas":  # the all-to-alls inside, around the kernels
        from gshard_mt.tpu.kernels import expert_ffn as expert_kernel  # optional: TPU kernels, only when asked

        expert_in = nn.with_logical_constraint(dispatcher.dispatch(x), EGCM_BY_GROUP)
        expert_out = expert_kernel.expert_ffn(expert_in, wi, wo, EGCM_BY_GROUP, EMH, self.kernel_vmem)
      else:
        expert_in = nn.with_logical_constraint(dispatcher.dispatch(x), EGCM)  # G -> E reshard: an all-to-all
        expert_out = expert_ffn(expert_in, wi, wo, cfg.activation)
      expert_out = nn.with_logical_constraint(expert_out, EGCM_BY_GROUP)  # E -> G: an all-to-all
      y = nn.with_logical_constraint(dispatcher.combine(expert_out), GSM)
    if cfg.shared_experts:
      Z = cfg.shared_experts
      shared_wi = self.param("shared_wi", nn.with_logical_partitioning(expert_init, ZMH), (Z, M, H), self.param_dtype)
      shared_wo = self.param("shared_wo", nn.with_logical_partitioning(expert_init, ZHM), (Z, H, M), self.param_dtype)
      y = y + shared_ffn(x, shared_wi.astype(self.dtype), shared_wo.astype(self.dtype), cfg.activation)
    stats = {"aux_loss": routing.aux_loss, "z_loss": routing.z_loss, "metrics": routing.metrics}
    return y.reshape(G * S, M)[: B * L].reshape(B, L, M), stats

"""`MoeConfig`: the MoE layer's options, their defaults, choices and checks, in one place: the config's `moe`
section, carried by the model to every MoE layer. The checks read each router's properties (causal, uses capacity,
experts per token) from its class in `ROUTERS`. Plain Python, no JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from gshard_mt.config.checks import Plus, Section
from gshard_mt.config.choices import ACTIVATIONS, DISPATCHES, GROUPED_KERNELS, ROUTERS
from gshard_mt.config.platforms import AUTO
from gshard_mt.errors import ConfigError

SECOND_EXPERT_POLICIES = ("all", "random")


@dataclasses.dataclass(frozen=True)
class MoeConfig(Section):
  """MoE options (GShard section 2.2; letters as in the paper)."""

  KEY: ClassVar[str] = "moe"
  CHOICES: ClassVar[dict[str, Any]] = {
      "router": ROUTERS, "decoder_router": Plus("", ROUTERS), "balance": ("aux_loss", "bias"),
      "second_expert_policy": SECOND_EXPERT_POLICIES, "dispatch": Plus(AUTO, DISPATCHES), "activation": ACTIVATIONS,
      "grouped_kernel": GROUPED_KERNELS, "expert_kernel": ("xla", "pallas")}
  POSITIVE: ClassVar[tuple[str, ...]] = ("num_experts", "hidden_dim", "group_size", "min_capacity")
  NONNEGATIVE: ClassVar[dict[str, str]] = {"shared_experts": "0 = none"}
  RANGES: ClassVar[dict[str, tuple]] = {key: (lambda x: x > 0, "> 0") for key in (
      "train_capacity_factor", "eval_capacity_factor", "second_expert_threshold", "bias_update_rate")} | {
      key: (lambda x: x >= 0, ">= 0") for key in ("jitter_noise", "router_logit_cap", "aux_loss_weight",
                                                  "z_loss_weight")}

  router: str = "gshard"  # a name in ROUTERS: GShard's top-2 (the default), 'switch', 'topk', 'expert_choice', ...
  decoder_router: str = ""  # the decoder's, '' = moe.router ('expert_choice' is not causal: never the decoder's)
  num_selected: int = 2  # k, 1-4, of 'topk', 'dropless', 'language'; experts per token on average in 'expert_choice'
  num_experts: int = 32  # E
  hidden_dim: int = 2048  # H of each expert
  group_size: int = 1024  # S: tokens routed together ("group-local dispatch")
  train_capacity_factor: float = 1.25  # C = max(min_capacity, ceil(factor * k * S / E)), k = 2 for 'gshard'
  eval_capacity_factor: float = 2.0
  min_capacity: int = 4
  second_expert_policy: str = "random"  # of 'gshard': 'all', or the paper's: kept iff uniform < g2 / threshold
  second_expert_threshold: float = 0.5
  dispatch: str = "auto"  # 'einsum' (the paper's), 'index', 'index_gather', 'grouped', 'shard_map'; auto: platforms
  grouped_kernel: str = "ragged_dot"  # of 'grouped': 'ragged_dot', or 'mosaic_gpu' (Pallas kernels; Hopper, bf16)
  expert_kernel: str = "xla"  # the capacity buffers' expert FFN: 'xla', or 'pallas' (TPU kernels; ReLU, H whole)
  activation: str = "relu"
  jitter_noise: float = 0.0  # multiplicative router-input noise while training
  router_logit_cap: float = 0.0  # cap * tanh(logits / cap) when > 0
  aux_loss_weight: float = 0.01  # the load-balancing loss's weight in the training loss
  z_loss_weight: float = 0.0  # router z-loss weight
  shared_experts: int = 0  # n dense experts of hidden H that every token passes through too (DeepSeekMoE)
  balance: str = "aux_loss"  # or 'bias': DeepSeek-V3's auxiliary-loss-free balancing (moe/balance.py)
  bias_update_rate: float = 0.001  # gamma of balance='bias': each step's move of the selection bias

  def router_of(self, decoder: bool) -> str:
    return (self.decoder_router or self.router) if decoder else self.router

  def router_class(self, decoder: bool = False) -> type:
    return ROUTERS.get(self.router_of(decoder))

  def experts_per_token(self, decoder: bool = False) -> int:
    """k of the encoder's (or decoder's) router: 2 for 'gshard', 1 for 'switch', else num_selected."""
    return self.router_class(decoder).experts_per_token(self.num_selected)

  def language_router(self) -> str | None:
    """The encoder's or decoder's router if it routes by the source-language tag, else None."""
    return next((self.router_of(d) for d in (False, True) if self.router_class(d).reads_language), None)

  def check_values(self):
    super().check_values()
    if not 1 <= self.num_selected <= 4:
      raise ConfigError(f"moe.num_selected={self.num_selected!r}: expected 1 to 4")

  def check_combination(self) -> MoeConfig:
    """Raises ConfigError naming the `moe.*` keys of options that do not work together (checked where MoE layers
    are used: a dense model's section is checked only as a section)."""
    k = max(self.experts_per_token(decoder) for decoder in (False, True))
    if self.num_experts < k:
      raise ConfigError(f"moe.num_experts={self.num_experts}: top-{k} gating needs at least {k} experts")
    if not self.router_class(decoder=True).causal:
      raise ConfigError(f"moe.router={self.router_of(decoder=True)!r} in the decoder: its choice of experts "
                        "for a token depends on the later tokens of its group, so it is not causal; set "
                        "moe.decoder_router (e.g. 'topk')")
    for name in sorted({self.router, self.router_of(decoder=True)}):
      if not ROUTERS.get(name).uses_capacity and self.dispatch != "grouped":
        raise ConfigError(f"moe.router={name!r} has no capacity: it needs moe.dispatch='grouped' (capacity "
                          f"buffers would give every expert S slots), not {self.dispatch!r}")
    if self.grouped_kernel != "ragged_dot" and self.dispatch != "grouped":
      raise ConfigError(f"moe.grouped_kernel={self.grouped_kernel!r} is the grouped dispatch's: it needs "
                        f"moe.dispatch='grouped', not {self.dispatch!r}")
    buffers = tuple(name for name, path in DISPATCHES.items() if path.capacity_buffers)
    if self.expert_kernel == "pallas" and (self.dispatch not in (AUTO, *buffers) or self.activation != "relu"):
      raise ConfigError(f"moe.expert_kernel='pallas' computes relu(x wi) wo on capacity buffers: it needs "
                        f"moe.activation='relu' and moe.dispatch in {buffers}, not "
                        f"{self.activation!r} and {self.dispatch!r}")
    if self.balance == "bias" and self.aux_loss_weight > 0:
      raise ConfigError(f"moe.balance='bias' balances without the auxiliary loss (DeepSeek-V3): set "
                        f"moe.aux_loss_weight=0, not {self.aux_loss_weight}")
    return self

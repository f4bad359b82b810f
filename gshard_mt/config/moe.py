"""`MoeConfig`: the MoE layer's options, their defaults and the checks of their values: the config's `moe` section,
carried by the model to every MoE layer. The names of routers, dispatches, ... and what only a combination of
options can break are checked by `training.validate`, against the classes they name. Plain Python, no JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from gshard_mt.config.checks import Section, fraction
from gshard_mt.config.errors import ConfigError

SECOND_EXPERT_POLICIES = ("all", "random")


@dataclasses.dataclass(frozen=True)
class MoeConfig(Section):
  """MoE options (GShard section 2.2; letters as in the paper)."""

  KEY: ClassVar[str] = "moe"
  CHOICES: ClassVar[dict[str, Any]] = {"balance": ("aux_loss", "bias"), "second_expert_policy": SECOND_EXPERT_POLICIES}
  POSITIVE: ClassVar[tuple[str, ...]] = ("num_experts", "hidden_dim", "group_size", "min_capacity")
  NONNEGATIVE: ClassVar[dict[str, str]] = {"shared_experts": "0 = none",
                                           "train_capacity": "0 = from moe.train_capacity_factor"}
  RANGES: ClassVar[dict[str, tuple]] = {key: (lambda x: x > 0, "> 0") for key in (
      "train_capacity_factor", "eval_capacity_factor", "second_expert_threshold", "bias_update_rate")} | {
      key: (lambda x: x >= 0, ">= 0") for key in ("jitter_noise", "router_logit_cap", "aux_loss_weight",
                                                  "z_loss_weight", "eval_capacity_fraction")} | {
      "expert_dropout": fraction()}

  router: str = "gshard"  # a name in moe.routers.ROUTERS: GShard's top-2 (the default), 'switch', 'topk', ...
  decoder_router: str = ""  # the decoder's, '' = moe.router ('expert_choice' is not causal: never the decoder's)
  num_selected: int = 2  # k, 1-4, of 'topk', 'dropless', 'language'; experts per token on average in 'expert_choice'
  num_experts: int = 32  # E
  hidden_dim: int = 2048  # H of each expert
  group_size: int = 1024  # S: tokens routed together ("group-local dispatch")
  train_capacity_factor: float = 1.25  # C = max(min_capacity, ceil(factor * k * S / E)), k = 2 for 'gshard'
  eval_capacity_factor: float = 2.0
  min_capacity: int = 4
  train_capacity: int = 0  # a fixed C while training (NLLB-MoE's expert_capacity); 0 = from the factor
  eval_capacity_fraction: float = 0.0  # C = ceil(fraction * S) in evaluation (NLLB-MoE's); 0 = from the factor
  normalize_before_drops: bool = True  # gates normalised over the k chosen before capacity drops (GShard); False:
  # the kept gates renormalised after them (NLLB-MoE's normalize_router_prob_before_dropping=False)
  second_expert_policy: str = "random"  # of 'gshard': 'all', or the paper's: kept iff uniform < g2 / threshold
  second_expert_threshold: float = 0.5
  dispatch: str = "auto"  # 'einsum' (the paper's), 'index', 'index_gather', 'grouped', 'shard_map'; auto: platforms
  grouped_kernel: str = "ragged_dot"  # of 'grouped': 'ragged_dot', or 'mosaic_gpu' (Mosaic GPU kernels; Hopper, bf16)
  expert_kernel: str = "xla"  # the capacity buffers' expert FFN: 'xla', or a kernel's (docs/config.md)
  activation: str = "relu"
  expert_bias: bool = False  # biases on the experts' matmuls, bi [E, H] and bo [E, M] (NLLB-MoE)
  expert_dropout: float = 0.0  # on each expert's output while training, which evaluation multiplies by (1 - rate)
  # instead (NLLB-MoE's moe_token_dropout)
  jitter_noise: float = 0.0  # multiplicative router-input noise while training
  router_logit_cap: float = 0.0  # cap * tanh(logits / cap) when > 0
  aux_loss_weight: float = 0.01  # the load-balancing loss's weight in the training loss
  z_loss_weight: float = 0.0  # router z-loss weight
  shared_experts: int = 0  # n dense experts of hidden H that every token passes through too (DeepSeekMoE)
  balance: str = "aux_loss"  # or 'bias': DeepSeek-V3's auxiliary-loss-free balancing (moe/balance.py)
  bias_update_rate: float = 0.001  # gamma of balance='bias': each step's move of the selection bias

  def router_of(self, decoder: bool) -> str:
    return (self.decoder_router or self.router) if decoder else self.router

  def check_values(self):
    super().check_values()
    if not 1 <= self.num_selected <= 4:
      raise ConfigError(f"moe.num_selected={self.num_selected!r}: expected 1 to 4")

"""`MoeConfig`: the MoE layer's options, their defaults, their choices and their checks, in one place.

The config file's `moe` section is exactly these fields (`gshard_mt.config.defaults` takes its defaults from
here), the model carries one MoeConfig to every MoE layer, and `MoeFeedForward` reads its options from it.
"""

from __future__ import annotations

import dataclasses

from gshard_mt.errors import ConfigError

SECOND_EXPERT_POLICIES = ("all", "random")
DISPATCHES = ("einsum", "index", "grouped", "shard_map")  # automatic (XLA places the all-to-alls) but shard_map
ACTIVATIONS = ("relu", "gelu")


@dataclasses.dataclass(frozen=True)
class MoeConfig:
  """Top-2 MoE options (GShard section 2.2; letters as in the paper)."""

  num_experts: int = 32  # E
  hidden_dim: int = 2048  # H of each expert
  group_size: int = 1024  # S: tokens routed together ("group-local dispatch")
  train_capacity_factor: float = 1.25  # C = max(min_capacity, ceil(factor * 2S / E))
  eval_capacity_factor: float = 2.0
  min_capacity: int = 4
  second_expert_policy: str = "random"  # 'all' or 'random' (the paper's: kept iff uniform < g2 / threshold)
  second_expert_threshold: float = 0.5
  # 'einsum' (the paper's), 'index' (gather by slot), 'grouped' (rows in blocks by expert, grouped matmuls over
  # the kept assignments only; one device: on a mesh XLA all-gathers its rows), 'shard_map' (manual all-to-alls)
  dispatch: str = "index"
  activation: str = "relu"
  jitter_noise: float = 0.0  # multiplicative router-input noise while training
  router_logit_cap: float = 0.0  # cap * tanh(logits / cap) when > 0
  aux_loss_weight: float = 0.01  # the load-balancing loss's weight in the training loss
  z_loss_weight: float = 0.0  # router z-loss weight

  @classmethod
  def from_config(cls, moe_section) -> MoeConfig:
    """From the config file's `moe` section (a ConfigDict or dict with these keys)."""
    return cls(**{f.name: moe_section[f.name] for f in dataclasses.fields(cls)})

  def validate(self, *, used: bool = True) -> MoeConfig:
    """Raises ConfigError naming the `moe.*` key; `used=False` (a dense model) checks only the choices."""
    for key, allowed in (("second_expert_policy", SECOND_EXPERT_POLICIES), ("dispatch", DISPATCHES),
                         ("activation", ACTIVATIONS)):
      if getattr(self, key) not in allowed:
        raise ConfigError(f"moe.{key}={getattr(self, key)!r}: expected one of {allowed}")
    for key in ("num_experts", "hidden_dim", "group_size", "min_capacity"):
      value = getattr(self, key)
      if not isinstance(value, int) or value <= 0:
        raise ConfigError(f"moe.{key}={value!r}: expected a positive integer")
    for key in ("train_capacity_factor", "eval_capacity_factor", "second_expert_threshold"):
      if not getattr(self, key) > 0:
        raise ConfigError(f"moe.{key}={getattr(self, key)!r}: expected > 0")
    if used and self.num_experts < 2:
      raise ConfigError(f"moe.num_experts={self.num_experts}: top-2 gating needs at least 2 experts")
    return self

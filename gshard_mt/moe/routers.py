"""The routers (`moe.router`): one class each, registered by name in `ROUTERS`. A router turns
logits [G, S, E] into a `gating.Routing`.

Class attributes tell the config and the model: `causal` (a token's choice of experts depends on no later token;
False: encoder only. Capacity may still drop a choice for a later token's: with k >= 2 a later token's first choice
takes its slot before an earlier token's second, GShard's priority), `uses_capacity` (False: C = S, nothing dropped;
moe.dispatch='grouped' only), `reads_language` (logits from the source-language tag, not the token),
`experts_per_token(num_selected)` (k, for the checks), `active_experts(cfg)` (the experts a token runs through on
average while training, for the FLOPs count). An instance has `needs_rng`, `capacity(S, E, factor, min_capacity)`
and `route(logits, C, padding_mask=, rng=, bias=)`; `bias` [E] is DeepSeek-V3's selection-only bias
(moe.balance='bias'). A new router is `@ROUTERS.register("name")` over a subclass of `Router`, in any module imported
before the config is read.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from gshard_mt.config.moe import MoeConfig
from gshard_mt.moe import expert_choice, gating
from gshard_mt.registry import Registry


class Router:
  """The interface, and the defaults of a top-k router with capacity that reads tokens (`k` its experts per
  token)."""

  causal: ClassVar[bool] = True
  uses_capacity: ClassVar[bool] = True
  reads_language: ClassVar[bool] = False
  needs_rng: ClassVar[bool] = False

  @classmethod
  def experts_per_token(cls, num_selected: int) -> int:
    return num_selected

  @classmethod
  def active_experts(cls, cfg: MoeConfig) -> float:
    return cls.experts_per_token(cfg.num_selected)

  @classmethod
  def from_config(cls, cfg: MoeConfig, *, deterministic: bool = True) -> Router:
    return cls(cfg.num_selected)

  def capacity(self, group_size: int, num_experts: int, factor: float, min_capacity: int) -> int:
    """C = cf * k * S / E (at least min_capacity)."""
    return gating.expert_capacity(group_size, num_experts, factor, min_capacity, num_selected=self.k)

  def route(self, logits, capacity, *, padding_mask=None, rng=None, bias=None) -> gating.Routing:
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class TopK(Router):
  """Top-k with capacity C = cf * k * S / E, GShard's normalisation and first-choices-first priority
  (`gating.topk_gating`); the 'random' second-expert policy is GShard's."""

  k: int = 2
  second_expert_policy: str = dataclasses.field(default="all", kw_only=True)  # keyword-only: TopK(3) is k = 3
  second_expert_threshold: float = dataclasses.field(default=0.5, kw_only=True)
  after_drops: bool = dataclasses.field(default=False, kw_only=True)  # not moe.normalize_before_drops

  @classmethod
  def from_config(cls, cfg: MoeConfig, *, deterministic: bool = True) -> TopK:
    return cls(cfg.num_selected, after_drops=not cfg.normalize_before_drops)

  @property
  def normalize(self) -> bool:
    """GShard's gates divided by their sum over the k chosen; not at k = 1, where that is 1 and the loss would not
    reach the router (the softmax gate then weighs the expert, as Switch's)."""
    return self.k > 1

  @property
  def needs_rng(self) -> bool:
    return self.second_expert_policy == "random"

  def route(self, logits, capacity, *, padding_mask=None, rng=None, bias=None) -> gating.Routing:
    return gating.topk_gating(logits, self.k, capacity, normalize=self.normalize, after_drops=self.after_drops,
                              bias=bias, padding_mask=padding_mask,
                              second_expert_policy=self.second_expert_policy,
                              second_expert_threshold=self.second_expert_threshold, rng=rng)


@dataclasses.dataclass(frozen=True)
class GShard(TopK):
  """GShard's top-2 (Algorithm 1, section 2.2), exact to Lingvo and praxis: top-k with k = 2 and the config's
  second-expert policy, 'random' while training only."""

  @classmethod
  def experts_per_token(cls, num_selected: int) -> int:
    return 2

  @classmethod
  def from_config(cls, cfg: MoeConfig, *, deterministic: bool = True) -> GShard:
    random = cfg.second_expert_policy == "random" and not deterministic
    return cls(2, second_expert_policy="random" if random else "all",
               second_expert_threshold=cfg.second_expert_threshold, after_drops=not cfg.normalize_before_drops)


@dataclasses.dataclass(frozen=True)
class Switch(TopK):
  """The Switch Transformer's top-1 (Fedus et al. 2021): C = cf * S / E, the output scaled by the chosen expert's
  softmax gate (not renormalised), the same load-balancing loss (E * sum_e f_e * P_e)."""

  k: int = 1

  @classmethod
  def experts_per_token(cls, num_selected: int) -> int:
    return 1

  @classmethod
  def from_config(cls, cfg: MoeConfig, *, deterministic: bool = True) -> Switch:
    return cls()


@dataclasses.dataclass(frozen=True)
class ExpertChoice(Router):
  """Expert choice (Zhou et al. 2022): each expert takes its top C = cf * k * S / E tokens (at most S), k being the
  mean experts per token. Not causal: an expert ranks the whole group. A per-expert bias changes no expert's
  ranking of tokens: it is ignored (and it never moves: every expert's load is C)."""

  k: int = 2
  causal: ClassVar[bool] = False

  @classmethod
  def active_experts(cls, cfg: MoeConfig) -> float:
    """Every slot holds a token, so a token runs through C * E / S = cf * k experts on average (at most E; the
    min_capacity floor left out): 2.5 for k = 2 at the training capacity factor 1.25."""
    return min(cfg.num_experts, cfg.train_capacity_factor * cfg.num_selected)

  def capacity(self, group_size: int, num_experts: int, factor: float, min_capacity: int) -> int:
    return min(group_size, super().capacity(group_size, num_experts, factor, min_capacity))

  def route(self, logits, capacity, *, padding_mask=None, rng=None, bias=None) -> gating.Routing:
    return expert_choice.expert_choice_gating(logits, capacity, padding_mask=padding_mask)


@dataclasses.dataclass(frozen=True)
class Dropless(TopK):
  """Top-k with no capacity (MegaBlocks): C = S, so no assignment is ever dropped; through the grouped path, which
  computes the G * S * k assignments and nothing more."""

  uses_capacity: ClassVar[bool] = False

  def capacity(self, group_size: int, num_experts: int, factor: float, min_capacity: int) -> int:
    return group_size


@dataclasses.dataclass(frozen=True)
class Language(Dropless):
  """Task-level routing (Kudugunta et al. 2021, "Beyond Distillation"): the router reads the embedding of the
  sentence's source-language tag instead of the token, so every token of a sentence goes to the same top-k experts
  of its language; dropless, as one language's sentences all want the same experts. Top-1 weighs its expert by 1:
  the gate would be a constant of the language, and with 1 a model keeping only some experts (tools/extract.py,
  whose softmax runs over fewer) computes what the full one does."""

  reads_language: ClassVar[bool] = True

  @property
  def normalize(self) -> bool:
    return True


# moe.router: the names in the order the errors list them, the default first
ROUTERS = Registry("moe.router").add({"gshard": GShard, "topk": TopK, "switch": Switch, "expert_choice": ExpertChoice,
                                      "dropless": Dropless, "language": Language})


def router_class(cfg: MoeConfig, decoder: bool = False) -> type[Router]:
  """The class of the encoder's (or the decoder's) router."""
  return ROUTERS.get(cfg.router_of(decoder))


def experts_per_token(cfg: MoeConfig, decoder: bool = False) -> int:
  """k of the encoder's (or decoder's) router: 2 for 'gshard', 1 for 'switch', else num_selected."""
  return router_class(cfg, decoder).experts_per_token(cfg.num_selected)


def language_router(cfg: MoeConfig) -> str | None:
  """The encoder's or decoder's router if it routes by the source-language tag, else None."""
  return next((cfg.router_of(d) for d in (False, True) if router_class(cfg, d).reads_language), None)


def make_router(cfg: MoeConfig, *, decoder: bool = False, deterministic: bool = True) -> Router:
  """The router of the encoder's (or the decoder's) MoE layers."""
  return router_class(cfg, decoder).from_config(cfg, deterministic=deterministic)

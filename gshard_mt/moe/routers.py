"""The routers (`moe.router`), small classes behind one interface, as V-MoE's dispatchers are.

A router turns router logits [G, S, E] into a `gating.Routing` (letters of the paper: G groups, S tokens per group,
E experts, C capacity, K assignments per token). Each one says:
- `capacity(S, E, factor, min_capacity)`: C, the slots per expert per group (S when it drops nothing);
- `route(logits, C, padding_mask=, rng=, bias=)`: the Routing; `bias` [E] is DeepSeek-V3's selection-only bias
  (moe.balance='bias'), ignored where it could change nothing;
- `reads_language`: whether its logits come from the sentence's source language instead of the token;
- `needs_rng`: whether `route` draws random numbers (the 'gating' stream).
Every dispatch path takes any Routing. Which routers are not causal (never in the decoder) and which have no
capacity (the grouped path only) is in `moe.config`, with the checks.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from gshard_mt.moe import expert_choice, gating, topk
from gshard_mt.moe.config import MoeConfig


@dataclasses.dataclass(frozen=True)
class GShard:
  """GShard's top-2 (Algorithm 1, section 2.2), exact to Lingvo and praxis: `gating.top2_gating`."""

  second_expert_policy: str = "all"
  second_expert_threshold: float = 0.5
  reads_language: ClassVar[bool] = False

  @property
  def needs_rng(self) -> bool:
    return self.second_expert_policy == "random"

  def capacity(self, group_size: int, num_experts: int, factor: float, min_capacity: int) -> int:
    return gating.expert_capacity(group_size, num_experts, factor, min_capacity)

  def route(self, logits, capacity, *, padding_mask=None, rng=None, bias=None) -> gating.Routing:
    return gating.top2_gating(logits, capacity, second_expert_policy=self.second_expert_policy,
                              second_expert_threshold=self.second_expert_threshold, rng=rng,
                              padding_mask=padding_mask, selection_bias=bias)


@dataclasses.dataclass(frozen=True)
class TopK:
  """Top-k with capacity C = cf * k * S / E, GShard's normalisation and first-choices-first priority."""

  k: int = 2
  reads_language: ClassVar[bool] = False
  needs_rng: ClassVar[bool] = False
  normalize: ClassVar[bool] = True

  def capacity(self, group_size: int, num_experts: int, factor: float, min_capacity: int) -> int:
    return gating.expert_capacity(group_size, num_experts, factor, min_capacity, num_selected=self.k)

  def route(self, logits, capacity, *, padding_mask=None, rng=None, bias=None) -> gating.Routing:
    del rng  # deterministic
    return topk.topk_gating(logits, self.k, capacity, normalize=self.normalize, bias=bias, padding_mask=padding_mask)


@dataclasses.dataclass(frozen=True)
class Switch(TopK):
  """The Switch Transformer's top-1 (Fedus et al. 2021): C = cf * S / E, the output scaled by the chosen expert's
  softmax gate (not renormalised), the same load-balancing loss (E * sum_e f_e * P_e)."""

  k: int = 1
  normalize: ClassVar[bool] = False


@dataclasses.dataclass(frozen=True)
class Dropless(TopK):
  """Top-k with no capacity (MegaBlocks): C = S, so no assignment is ever dropped; through the grouped path, which
  computes the G * S * k assignments and nothing more."""

  def capacity(self, group_size: int, num_experts: int, factor: float, min_capacity: int) -> int:
    return group_size


@dataclasses.dataclass(frozen=True)
class Language(Dropless):
  """Task-level routing (Kudugunta et al. 2021, "Beyond Distillation"): the router reads the embedding of the
  sentence's source-language tag instead of the token, so every token of a sentence goes to the same top-k experts
  of its language; dropless, as one language's sentences all want the same experts."""

  reads_language: ClassVar[bool] = True


@dataclasses.dataclass(frozen=True)
class ExpertChoice:
  """Expert choice (Zhou et al. 2022): each expert takes its top C = cf * k * S / E tokens (at most S), k being the
  mean experts per token. Not causal: an expert ranks the whole group. A per-expert bias changes no expert's
  ranking of tokens: it is ignored (and it never moves: every expert's load is C)."""

  k: int = 2
  reads_language: ClassVar[bool] = False
  needs_rng: ClassVar[bool] = False

  def capacity(self, group_size: int, num_experts: int, factor: float, min_capacity: int) -> int:
    return min(group_size, gating.expert_capacity(group_size, num_experts, factor, min_capacity, num_selected=self.k))

  def route(self, logits, capacity, *, padding_mask=None, rng=None, bias=None) -> gating.Routing:
    del rng, bias
    return expert_choice.expert_choice_gating(logits, capacity, padding_mask=padding_mask)


ROUTERS = {"gshard": GShard, "switch": Switch, "topk": TopK, "expert_choice": ExpertChoice, "dropless": Dropless,
           "language": Language}  # keys: moe.config.ROUTERS (tested)


def make_router(cfg: MoeConfig, *, decoder: bool = False, deterministic: bool = True):
  """The router of the encoder's (or the decoder's) MoE layers; the 'random' second-expert policy applies to
  `gshard` while training only."""
  name = cfg.router_of(decoder)
  if name == "gshard":
    random = cfg.second_expert_policy == "random" and not deterministic
    return GShard("random" if random else "all", cfg.second_expert_threshold)
  return ROUTERS[name]() if name == "switch" else ROUTERS[name](cfg.num_selected)

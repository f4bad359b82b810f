"""The one validation step of a config, after its sections checked their own values: the names that choose code
(routers, dispatches, sources, schedules, ...) against the registries beside the classes they name, and what only a
combination of options can break. Every command that reads a config calls `check` before any data is read
(`cli.load` for a config file; `load_saved` for a run's config.json); each error is one line naming the keys.
"""

from __future__ import annotations

from gshard_mt import config_files, io
from gshard_mt.config import Config, moe_group_error
from gshard_mt.config.checks import Plus
from gshard_mt.config.platforms import AUTO
from gshard_mt.data.sources import SOURCES
from gshard_mt.errors import ConfigError
from gshard_mt.kernels import seam
from gshard_mt.model.layers import ATTENTIONS, DROPOUT_KEYS
from gshard_mt.model.transformer import EMBEDDING_SCHEMES, REMAT_POLICIES
from gshard_mt.moe import routers
from gshard_mt.moe.experts import ACTIVATIONS, PATHS
from gshard_mt.moe.grouped import GROUPED_KERNELS
from gshard_mt.moe.routers import ROUTERS
from gshard_mt.parallel.rules import RULES
from gshard_mt.training.schedules import SCHEDULES

# Each key whose value names code -> what it may be: a registry, or a registry plus other values.
CHOICES = {
    "model.embedding": EMBEDDING_SCHEMES, "model.dropout_rng": Plus(AUTO, DROPOUT_KEYS),
    "model.remat": REMAT_POLICIES, "model.attention": Plus(AUTO, ATTENTIONS, *seam.ATTENTION_KERNELS),
    "moe.router": ROUTERS, "moe.decoder_router": Plus("", ROUTERS), "moe.dispatch": Plus(AUTO, PATHS),
    "moe.activation": ACTIVATIONS, "moe.grouped_kernel": GROUPED_KERNELS, "moe.expert_kernel": seam.KERNEL_CHOICES,
    "optimizer.schedule": SCHEDULES, "optimizer.kernel": seam.KERNEL_CHOICES,
    "optimizer.loss_kernel": seam.KERNEL_CHOICES, "partitioning": RULES,
}


def check(config):
  """`config` (a parsed `Config`) if every name and combination works, else a ConfigError naming the keys."""
  for key, allowed in CHOICES.items():
    section, _, name = key.rpartition(".")
    if (value := getattr(getattr(config, section) if section else config, name)) not in allowed:
      raise ConfigError(f"{key}={value!r}: expected one of {tuple(allowed)}")
  check_sources(config.data)
  seam.check(config)
  if config.model.moe_interval:  # a dense model: its moe section is checked for its values and names only
    check_moe(config)
    check_nllb_routing(config.moe)
  return config


def load_saved(workdir: io.PathLike) -> Config:
  """A run's config.json (`config_files.load_saved`), checked by `check`; an error names the file."""
  return config_files.load_saved(workdir, check)


def check_sources(data) -> None:
  """data.source: known names, none twice, and a path for those that read one."""
  sources = data.source.split("+")
  if not all(s.partition(":")[0] in SOURCES for s in sources) or len(set(sources)) != len(sources):
    raise ConfigError(f"data.source={data.source!r}: expected one of {SOURCES.names()} (tfds:NAME for a TFDS "
                      "dataset), or several different ones joined with '+' (e.g. 'tatoeba+multi30k')")
  for name, _, arg in (s.partition(":") for s in sources):
    if SOURCES.get(name).needs_path and not (arg or data.path):
      raise ConfigError(f"data.source={name!r} reads data.path (or '{name}:PATH'), which is empty")


def check_moe(config) -> None:
  """The MoE options that do not work together, or not with the data, the mesh or the batch."""
  moe = config.moe
  k = max(routers.experts_per_token(moe, decoder) for decoder in (False, True))
  if moe.num_experts < k:
    raise ConfigError(f"moe.num_experts={moe.num_experts}: top-{k} gating needs at least {k} experts")
  if not routers.router_class(moe, decoder=True).causal:
    raise ConfigError(f"moe.router={moe.router_of(decoder=True)!r} in the decoder: its choice of experts for a "
                      "token depends on the later tokens of its group, so it is not causal; set moe.decoder_router "
                      "(e.g. 'topk')")
  for name in sorted({moe.router, moe.router_of(decoder=True)}):
    if not ROUTERS.get(name).uses_capacity and moe.dispatch != "grouped":
      raise ConfigError(f"moe.router={name!r} has no capacity: it needs moe.dispatch='grouped' (capacity buffers "
                        f"would give every expert S slots), not {moe.dispatch!r}")
  if moe.grouped_kernel != "ragged_dot" and moe.dispatch != "grouped":
    raise ConfigError(f"moe.grouped_kernel={moe.grouped_kernel!r} is the grouped dispatch's: it needs "
                      f"moe.dispatch='grouped', not {moe.dispatch!r}")
  if moe.balance == "bias" and moe.aux_loss_weight > 0:
    raise ConfigError(f"moe.balance='bias' balances without the auxiliary loss (DeepSeek-V3): set "
                      f"moe.aux_loss_weight=0, not {moe.aux_loss_weight}")
  if (name := routers.language_router(moe)) and not config.data.source_tags:
    raise ConfigError(f"moe.router={name!r} routes by the source-language tag: it needs data.source_tags=True")
  expert_axis = config.mesh.expert * config.dcn_mesh.expert
  if expert_axis > 1 and moe.num_experts % expert_axis:
    raise ConfigError(f"moe.num_experts={moe.num_experts} is not divisible by the expert axis, "
                      f"mesh.expert={config.mesh.expert} x dcn_mesh.expert={config.dcn_mesh.expert}")
  if error := moe_group_error(config):
    raise ConfigError(error)


def check_nllb_routing(moe) -> None:
  """NLLB-MoE's routing options (moe.normalize_before_drops, its capacity rules, moe.expert_dropout) against the
  routers and paths that serve them: top-k routers with capacity, any path but the manual one for the dropout."""
  for decoder in (False, True):
    name, kind = moe.router_of(decoder), routers.router_class(moe, decoder)
    top_k = issubclass(kind, routers.TopK) and kind.experts_per_token(moe.num_selected) > 1
    if not moe.normalize_before_drops and not top_k:
      raise ConfigError(f"moe.normalize_before_drops=False renormalises the kept gates of a top-k router (k >= 2): "
                        f"moe.router={name!r} has none to renormalise")
    rules = [key for key in ("train_capacity", "eval_capacity_fraction") if getattr(moe, key)]
    if rules and not (issubclass(kind, routers.TopK) and kind.uses_capacity):
      raise ConfigError(f"moe.{rules[0]}={getattr(moe, rules[0])} sets the capacity of a top-k router: "
                        f"moe.router={name!r} has no such capacity")
  if moe.expert_dropout and moe.dispatch == "shard_map":
    raise ConfigError(f"moe.expert_dropout={moe.expert_dropout} is not served by moe.dispatch='shard_map' (its "
                      "devices would draw the same dropout mask); use another dispatch")

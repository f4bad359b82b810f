"""A run's starting point taken from another run (`init_from`): sparse upcycling, or fine-tuning.

Sparse upcycling (Komatsuzaki et al., ICLR 2023): from a dense run, every parameter is copied; each MoE layer's E
experts start as copies of the dense FFN they replace (wi [M, F] -> [E, M, H], wo [F, M] -> [E, H, M], H = F,
and its biases bi [F] -> [E, H], bo [M] -> [E, M]: `moe.expert_bias` follows the dense `model.bias`),
optionally with noise (`init_from_noise`: Gaussian of that share of the dense weight's standard deviation); the
router (wg, its balance bias, shared experts) starts fresh. With top-2 gates that sum to 1 and a capacity that
drops nothing, the upcycled model computes what the dense one does. From a run of the same architecture every
parameter is copied (fine-tuning), and from a dense run too with init_from_upcycle=False. The optimizer starts fresh
either way, and training saves the starting point as step 0.

Layers are matched by their index in each stack, whatever the units they are scanned in (a dense stack's units
hold one layer, a MoE one's `moe_interval`): layer i of unit u, position j, is i = u * unit_size + j.
"""

from __future__ import annotations

import json

import jax
import numpy as np
from flax import traverse_util

from gshard_mt import config as config_lib
from gshard_mt import io
from gshard_mt.data import prepare as prepare_lib
from gshard_mt.data import tokenizer_files
from gshard_mt.errors import ConfigError, WorkdirError, one_line
from gshard_mt.moe import ffn
from gshard_mt.training import checkpoint as checkpoint_lib
from gshard_mt.training import validate
from gshard_mt.training.setup import Setup, build

STACKS = ("encoder", "decoder")
EXPERT_WEIGHTS = {("moe", name): ("ffn", name) for name in ffn.PARAMS}  # each expert <- the dense FFN's (biases too)


def layers_of(stack: dict) -> tuple[list[dict], dict]:
  """A stack's parameters -> (each layer's {path: array} in order, the rest {path: array}, e.g. the final norm).
  Scanned units ('units', [U, ...] leaves) are sliced; looped ones ('unit_<u>') read as they are."""
  flat = traverse_util.flatten_dict(stack)
  unit_size = 1 + max((int(p[1].split("_")[1]) for p in flat if p[0] == "units" or p[0].startswith("unit_")),
                      default=0)
  layers, rest = {}, {}
  for path, value in flat.items():
    if path[0] == "units":
      for u in range(value.shape[0]):
        layers.setdefault(u * unit_size + int(path[1].split("_")[1]), {})[path[2:]] = value[u]
    elif path[0].startswith("unit_"):
      layers.setdefault(int(path[0].split("_")[1]) * unit_size + int(path[1].split("_")[1]), {})[path[2:]] = value
    else:
      rest[path] = value
  return [layers[i] for i in sorted(layers)], rest


def copied_layer(source: dict, target: dict, where: str, noise: float, rng: np.random.Generator) -> dict:
  """One layer's parameters {path: array} in the target's shapes: the source's where they match, each expert a
  copy of the source's dense FFN, the router and any other MoE parameter the target's (fresh)."""
  out = {}
  for path, fresh in target.items():
    dense = EXPERT_WEIGHTS.get(path)
    if path in source and np.shape(source[path]) == np.shape(fresh):
      out[path] = source[path]
    elif dense is not None and dense not in source and path[1].startswith("b"):
      out[path] = fresh  # the experts' biases (zeros) under a dense FFN that has none: the same function
    elif dense is not None:
      if dense not in source:
        raise WorkdirError(f"init_from: {where} has no dense FFN to copy into this model's experts (its "
                           f"{'/'.join(path)} is {list(np.shape(source.get(path, ())))}, this model's "
                           f"{list(np.shape(fresh))})")
      weight = np.asarray(source[dense])
      if weight.shape != np.shape(fresh)[1:]:
        raise WorkdirError(f"init_from: the dense FFN {'/'.join(dense)} of {where} is {list(weight.shape)}, this "
                           f"model's experts {list(np.shape(fresh)[1:])} each: moe.hidden_dim must equal the "
                           "dense model.mlp_dim, and model.emb_dim the same")
      experts = np.broadcast_to(weight, np.shape(fresh))
      if noise:
        experts = experts + noise * weight.std() * rng.standard_normal(experts.shape)
      out[path] = np.asarray(experts, weight.dtype)
    elif path[0] == "moe":
      out[path] = fresh  # the router, its balance bias, shared experts
    elif path in source:
      raise WorkdirError(f"init_from: {'/'.join(path)} of {where} is {list(np.shape(source[path]))}, this model's "
                         f"{list(np.shape(fresh))}: the architectures differ")
    else:
      raise WorkdirError(f"init_from: {where} has no {'/'.join(path)}: another architecture")
  lost = [dense for experts, dense in EXPERT_WEIGHTS.items()
          if dense in source and experts not in target and dense not in target and ("moe", "wi") in target]
  if lost:
    raise WorkdirError(f"init_from: the dense FFN of {where} has {', '.join('/'.join(d) for d in lost)}, this "
                       "model's experts none: set moe.expert_bias=True, or the upcycled model drops them")
  return out


def stacked(layers: list[dict], rest: dict, like: dict) -> dict:
  """`layers_of`'s inverse, in the units of the stack `like` (its structure)."""
  unit_size = len({p[1] for p in traverse_util.flatten_dict(like) if p[0] == "units" or p[0].startswith("unit_")})
  out = dict(rest)
  for path, value in traverse_util.flatten_dict(like).items():
    if path[0] == "units":
      j = int(path[1].split("_")[1])
      out[path] = np.stack([layers[u * unit_size + j][path[2:]] for u in range(value.shape[0])])
    elif path[0].startswith("unit_"):
      out[path] = layers[int(path[0].split("_")[1]) * unit_size + int(path[1].split("_")[1])][path[2:]]
  return traverse_util.unflatten_dict(out)


def initial_params(source: dict, target: dict, *, name: str, noise: float = 0.0, seed: int = 0) -> dict:
  """The target's parameter tree (fresh: its shapes, its router) filled from the source run's `source` (see the
  module's docstring); `name` names the source in errors."""
  rng = np.random.default_rng(seed)
  out = {}
  for key, fresh in target.items():
    if key not in source:
      raise WorkdirError(f"init_from: {name} has no parameters {key!r}: another architecture")
    if key not in STACKS:
      out[key] = jax.tree.map(lambda s, t, k=key: _same_shape(s, t, f"{name}'s {k}"), source[key], fresh)
      continue
    (src_layers, src_rest), (tgt_layers, tgt_rest) = layers_of(source[key]), layers_of(fresh)
    if len(src_layers) != len(tgt_layers):
      raise WorkdirError(f"init_from: {name}'s {key} has {len(src_layers)} layers, this model's {len(tgt_layers)}")
    layers = [copied_layer(s, t, f"{name}'s {key} layer {i}", noise, rng)
              for i, (s, t) in enumerate(zip(src_layers, tgt_layers))]
    rest = {path: _same_shape(src_rest.get(path), value, f"{name}'s {key} {'/'.join(path)}")
            for path, value in tgt_rest.items()}
    out[key] = stacked(layers, rest, fresh)
  return out


def _same_shape(source, target, where: str):
  if source is None or np.shape(source) != np.shape(target):
    raise WorkdirError(f"init_from: {where} is {None if source is None else list(np.shape(source))}, this model's "
                       f"{list(np.shape(target))}")
  return source


def source_tokenizer(source: io.PathLike) -> io.epath.Path:
  """The tokenizer the run in `source` trained with: the copy in the prepared corpus its start recorded."""
  source_config = validate.load_saved(source)
  if source_config.data.tokenizer:  # given to it (an imported model's)
    return io.path(source_config.data.tokenizer)
  record = io.path(source) / prepare_lib.RUN_RECORD
  if not record.exists():
    raise WorkdirError(f"init_from={source}: no {prepare_lib.RUN_RECORD}, so no tokenizer (train it first)")
  prepared = prepare_lib.root(source_config.data, source) / json.loads(record.read_text())["name"]
  tokenizer_files.found(prepared, f"init_from={source}: its prepared corpus")  # still there
  return prepared


# The model and moe keys that change the parameters' shapes: a fine-tuned run must have the source's
PARAMETER_KEYS = tuple(f"model.{k}" for k in (
    "emb_dim", "num_heads", "head_dim", "mlp_dim", "num_encoder_layers", "num_decoder_layers", "moe_interval",
    "share_embeddings", "tied_logits", "positions", "max_position", "bias", "vocab_size")) + tuple(
    f"moe.{k}" for k in ("num_experts", "hidden_dim", "shared_experts", "expert_bias", "balance"))


def resolved(config):
  """The config as it trains, before any data is read. With init_from: the source run's model and moe keys where
  this config leaves their defaults (except upcycling, `upcycles`, which keeps its own moe keys and moe_interval
  and gives the experts biases where the dense FFN has them), a ConfigError naming the keys set otherwise that
  change the parameters; and, with no data.tokenizer, the source run's tokenizer, so that it tokenizes as the
  source did. A given tokenizer sets data.vocab_size (its vocabulary, which the model and the mesh's checks read)."""
  if config.init_from:
    config = validate.check(config_lib.replace(config, source_keys(config)))
  path = config.data.tokenizer or (str(source_tokenizer(config.init_from)) if config.init_from else "")
  if not path:
    return config
  return config_lib.replace(config, {"data.tokenizer": path, "data.vocab_size": tokenizer_files.load(path).vocab_size})


def source_keys(config) -> dict:
  """{key: the source run's value} of the model and moe keys this config leaves at their defaults (a saved config
  has every key: load_saved gives a key added since the source ran its default)."""
  source = validate.load_saved(config.init_from)
  mine, theirs, default = (config_lib.flatten(config_lib.to_dict(c)) for c in (config, source, type(config)()))
  upcycle = upcycles(config, source)
  keys = [k for k in mine if k.split(".")[0] in ("model", "moe")
          and not (upcycle and (k.startswith("moe.") or k == "model.moe_interval"))]
  clash = [k for k in keys if k in PARAMETER_KEYS and mine[k] != default[k] and mine[k] != theirs[k]]
  if clash:
    raise ConfigError(f"init_from={config.init_from}: " + ", ".join(
        f"{k}={mine[k]!r} here, {theirs[k]!r} there" for k in clash) + ": these change the "
        "parameters' shapes; leave them at their defaults to take the source run's")
  taken = {k: theirs[k] for k in keys if mine[k] == default[k] != theirs[k]}
  if upcycle and source.model.bias and mine["moe.expert_bias"] == default["moe.expert_bias"]:
    taken["moe.expert_bias"] = True  # each expert copies the dense FFN's biases too
  return taken


def upcycles(config, source) -> bool:
  """Whether `config` upcycles the run whose config is `source`: a MoE config from a dense run, unless
  init_from_upcycle=False (then it takes the dense architecture, as from any other run)."""
  return bool(config.init_from_upcycle and config.model.moe_interval and not source.model.moe_interval)


def source_params(config, workdir, setup: Setup) -> tuple[dict, str]:
  """(the newest checkpoint's parameters of the run config.init_from, as numpy; its name), after checking that it
  tokenizes as this run does (a tokenizer of the same bytes)."""
  source = io.path(config.init_from)
  source_config = validate.load_saved(source)
  theirs = source_tokenizer(source)
  mine = prepare_lib.for_run(config.data, workdir)
  if tokenizer_files.digest(mine) != tokenizer_files.digest(theirs, f"init_from={source}: its prepared corpus"):
    raise WorkdirError(f"init_from={source}: its tokenizer ({theirs}) is not this run's ({mine}, data.tokenizer="
                       f"{config.data.tokenizer!r}): leave data.tokenizer '' to take the source run's")
  abstract = build(source_config, setup.model_cfg.model.vocab_size).abstract_target()
  try:
    with checkpoint_lib.Checkpoints(source / checkpoint_lib.FOLDER, read_only=True) as ckpts:
      restored = ckpts.restore(abstract)
  except Exception as e:  # noqa: BLE001 - orbax reports missing and unreadable checkpoints in several ways
    raise WorkdirError(f"init_from={source}: no checkpoint restores ({one_line(e)})") from None
  if restored is None:
    raise WorkdirError(f"init_from={source}: no checkpoint in {source / checkpoint_lib.FOLDER} (train it first)")
  step, state, _ = restored
  return jax.device_get(state.params), f"{source} (step {step})"


def initial_state(config, workdir, setup: Setup):
  """The train state this run starts from: `setup`'s fresh state (optimizer, rng, router) with the parameters of
  config.init_from copied in (`initial_params`)."""
  params, name = source_params(config, workdir, setup)
  fresh = setup.init_state(config.seed)
  copied = initial_params(params, jax.device_get(fresh.params), name=name, noise=config.init_from_noise,
                          seed=config.seed)
  copied = jax.device_put(copied, setup.state_shardings.params)
  return fresh.replace(params=copied, opt_state=jax.jit(setup.tx.init, out_shardings=setup.state_shardings.opt_state)(
      copied))

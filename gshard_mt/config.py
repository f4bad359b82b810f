"""Config files (Python files with `get_config()`), dotted command-line overrides, validation, saving.

  python train.py --config configs/tiny.py --workdir runs/tiny --config.moe.num_experts=16
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import math
import pathlib

import ml_collections

from gshard_mt import files
from gshard_mt.data.corpus import SOURCES

CHOICES = {
    "nonfinite": ("stop", "skip"),
    "model.positions": ("sinusoidal", "learned"),
    "model.embedding": ("vaswani", "t5", "sqrt_input", "small_logits"),
    "model.dtype": ("float32", "bfloat16"),
    "moe.second_expert_policy": ("all", "random"),
    "moe.dispatch": ("einsum", "index", "shard_map"),
    "moe.activation": ("relu", "gelu"),
    "optimizer.name": ("adafactor", "adam"),
    "optimizer.schedule": ("rsqrt", "constant"),
    "partitioning": ("data", "expert", "expert_model"),
}


class ConfigError(ValueError):
  """A config key has a bad or impossible value; the message names the key."""


def load_file(path: str | pathlib.Path, **kwargs) -> ml_collections.ConfigDict:
  """`get_config(**kwargs)` of a config file."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise ConfigError(f"config file {path} not found")
  spec = importlib.util.spec_from_file_location(f"_gshard_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ConfigError(f"{path} has no get_config() function")
  return module.get_config(**kwargs)


def _parse_value(key: str, text: str, current):
  if isinstance(current, bool):
    if text.lower() in ("true", "1", "yes"):
      return True
    if text.lower() in ("false", "0", "no"):
      return False
    raise ConfigError(f"--config.{key}={text}: expected true or false")
  if isinstance(current, str):
    return text
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    if text.lower() in ("inf", "infinity", "nan"):
      value = float(text.lower())
    else:
      raise ConfigError(f"--config.{key}={text}: expected a {type(current).__name__}") from None
  if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if type(value) is not type(current):
    raise ConfigError(f"--config.{key}={text}: expected a {type(current).__name__}, got {type(value).__name__}")
  return value


def apply_overrides(config: ml_collections.ConfigDict, overrides: dict[str, str]) -> ml_collections.ConfigDict:
  """Sets `key.sub=value` strings, typed like the existing value; an unknown key is an error."""
  flat = flatten(config)
  for key, text in overrides.items():
    if key not in flat:
      close = difflib.get_close_matches(key, list(flat), n=3)
      raise ConfigError(f"unknown config key {key!r}" + (f"; did you mean {', '.join(close)}?" if close else ""))
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = _parse_value(key, text, flat[key])
  return config


def flatten(config, prefix="") -> dict:
  out = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None):
  """Raises ConfigError for an impossible combination, before anything is built or compiled."""
  flat = flatten(config)
  for key, allowed in CHOICES.items():
    if flat.get(key) not in allowed:
      raise ConfigError(f"{key}={flat.get(key)!r}: expected one of {allowed}")
  sources = str(config.data.source).split("+")
  if any(s not in SOURCES for s in sources) or len(set(sources)) != len(sources):
    raise ConfigError(f"data.source={config.data.source!r}: expected one of {SOURCES}, or several different ones "
                      "joined with '+' (e.g. 'tatoeba+multi30k')")
  for key in ("batch_size", "num_train_steps", "log_every", "checkpoint_every", "keep_checkpoints",
              "model.emb_dim", "model.num_heads", "model.head_dim", "model.mlp_dim", "moe.num_experts",
              "moe.hidden_dim", "moe.group_size", "data.max_length", "data.vocab_size"):
    if not isinstance(flat[key], int) or flat[key] <= 0:
      raise ConfigError(f"{key}={flat[key]!r}: expected a positive integer")
  m = config.model
  interval = m.moe_interval
  if interval < 0:
    raise ConfigError(f"model.moe_interval={interval}: expected >= 0 (0 = dense)")
  for key in ("num_encoder_layers", "num_decoder_layers"):
    if interval and m[key] % interval:
      raise ConfigError(f"model.{key}={m[key]} is not a multiple of model.moe_interval={interval}")
  if interval and config.moe.num_experts < 2:
    raise ConfigError(f"moe.num_experts={config.moe.num_experts}: top-2 gating needs at least 2 experts")
  tokens = config.batch_size * config.data.max_length
  if interval and tokens > config.moe.group_size and tokens % config.moe.group_size:
    raise ConfigError(f"moe.group_size={config.moe.group_size} does not divide the {tokens} tokens of a batch "
                      f"(batch_size={config.batch_size} x data.max_length={config.data.max_length})")
  expert_axis = config.mesh.expert * dcn_shape(config)[1]
  if expert_axis > 1 and config.moe.num_experts % expert_axis:
    raise ConfigError(f"moe.num_experts={config.moe.num_experts} is not divisible by the expert axis, "
                      f"mesh.expert={config.mesh.expert} x dcn_mesh.expert={config.dcn_mesh.expert}")
  if num_devices is not None:
    data, expert, _ = mesh_shape(config, num_devices)
    batch_devices = data * expert if config.partitioning != "data" else data
    if config.batch_size % batch_devices:
      raise ConfigError(f"batch_size={config.batch_size} does not split over the {batch_devices} devices of the "
                        "mesh's data and expert axes")
    groups = max(tokens // config.moe.group_size, 1)
    if interval and groups % batch_devices:
      raise ConfigError(f"the {groups} MoE groups of a batch (batch_size x data.max_length / moe.group_size) do "
                        f"not split over the {batch_devices} devices of the data and expert axes; lower "
                        "moe.group_size or raise batch_size")
  if not config.data.temperature > 0:
    raise ConfigError(f"data.temperature={config.data.temperature}: expected > 0 (inf for uniform)")


def dcn_shape(config) -> tuple[int, int, int]:
  """(data, expert, model): how many slices (the DCN granules: TPU slices, or processes) each mesh axis spans."""
  dcn = tuple(config.dcn_mesh[a] for a in ("data", "expert", "model"))
  if any(not isinstance(v, int) or v < 1 for v in dcn):
    raise ConfigError(f"dcn_mesh sizes must be positive integers, got {dict(config.dcn_mesh)}")
  return dcn


def ici_shape(config, num_devices: int) -> tuple[int, int, int]:
  """(data, expert, model) within one slice; mesh.data = -1 takes the devices the other axes leave."""
  slices = math.prod(dcn_shape(config))
  if num_devices % slices:
    raise ConfigError(f"dcn_mesh asks for {slices} slices, which does not divide the {num_devices} devices")
  num_devices //= slices
  where = f"the {num_devices} devices" + (f" of each of the {slices} slices (dcn_mesh)" if slices > 1 else "")
  expert, model, data = config.mesh.expert, config.mesh.model, config.mesh.data
  if expert < 1 or model < 1 or (data < 1 and data != -1):
    raise ConfigError(f"mesh sizes must be positive (mesh.data may be -1), got data={data} expert={expert} "
                      f"model={model}")
  if data == -1:
    if num_devices % (expert * model):
      raise ConfigError(f"mesh.expert={expert} x mesh.model={model} does not divide {where}")
    data = num_devices // (expert * model)
  if data * expert * model != num_devices:
    raise ConfigError(f"mesh data={data} x expert={expert} x model={model} = {data * expert * model} does not "
                      f"match {where}")
  return data, expert, model


def mesh_shape(config, num_devices: int) -> tuple[int, int, int]:
  """(data, expert, model) sizes of the whole mesh: the in-slice (ICI) sizes times the DCN sizes."""
  return tuple(i * d for i, d in zip(ici_shape(config, num_devices), dcn_shape(config)))


def load(path, overrides: dict[str, str] | None = None, num_devices=None) -> ml_collections.ConfigDict:
  config = apply_overrides(load_file(path), overrides or {})
  validate(config, num_devices)
  return config


def split_overrides(argv: list[str]) -> tuple[list[str], dict[str, str]]:
  """Separates `--config.key=value` (or `--config.key value`) arguments from the others."""
  rest, overrides, i = [], {}, 0
  while i < len(argv):
    arg = argv[i]
    if arg.startswith("--config."):
      if "=" in arg:
        key, value = arg[len("--config."):].split("=", 1)
      elif i + 1 < len(argv):
        key, value, i = arg[len("--config."):], argv[i + 1], i + 1
      else:
        raise ConfigError(f"{arg} needs a value")
      overrides[key] = value
    else:
      rest.append(arg)
    i += 1
  return rest, overrides


def save(config: ml_collections.ConfigDict, workdir: str | pathlib.Path):
  """Writes workdir/config.json atomically; a resumed run must have the same model, moe and data keys."""
  path = pathlib.Path(workdir) / "config.json"
  if path.exists():
    old = flatten(ml_collections.ConfigDict(json.loads(path.read_text())))
    new = flatten(config)
    changed = [k for k in new if k.split(".")[0] in ("model", "moe", "data") and old.get(k) != new[k]
               and k != "data.prefetch"]
    if changed:
      raise ConfigError(f"{path} was written for a different run: " + ", ".join(
          f"{k}: {old.get(k)!r} -> {new[k]!r}" for k in changed) + "; use a new --workdir")
  path.parent.mkdir(parents=True, exist_ok=True)
  files.write_atomically(path, config.to_json(indent=2))


def load_saved(workdir: str | pathlib.Path) -> ml_collections.ConfigDict:
  path = pathlib.Path(workdir) / "config.json"
  if not path.is_file():
    raise ConfigError(f"{path} not found: is {workdir} a gshard_mt work directory?")
  return ml_collections.ConfigDict(json.loads(path.read_text()))

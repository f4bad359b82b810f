"""Config files (Python files with `get_config()`), dotted command-line overrides, validation, saving.

  python train.py --config configs/tiny.py --workdir runs/tiny --config.moe.num_experts=16
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import math
import os
import pathlib
import traceback

import ml_collections

from gshard_mt import io
from gshard_mt.config import choices, defaults
from gshard_mt.config.moe import MoeConfig
from gshard_mt.errors import ConfigError, UserError, article

DTYPES = ("float32", "bfloat16")
CHOICES = {
    "nonfinite": ("stop", "skip"),
    "model.positions": ("sinusoidal", "learned"),
    "model.embedding": choices.EMBEDDINGS,
    "model.dtype": DTYPES,
    "model.residual_dtype": DTYPES,
    "model.dropout_rng": choices.DROPOUT_KEYS,
    "model.remat": choices.REMAT_POLICIES,
    "model.attention": choices.ATTENTIONS,
    "optimizer.name": ("adafactor", "adam"),
    "optimizer.kernel": ("xla", "pallas"),
    "optimizer.loss_kernel": ("xla", "pallas"),
    "optimizer.schedule": choices.SCHEDULES,
    "optimizer.warmup": ("linear", "constant"),
    "partitioning": choices.PARTITIONINGS,
}
LENGTH_KEYS = ("data.max_length", "data.max_target_length")  # the row lengths of `row_lengths`, in order
POSITIVE_KEYS = ("batch_size", "num_microbatches", "num_train_steps", "log_every", "checkpoint_every",
                 "keep_checkpoints", "model.emb_dim", "model.num_heads", "model.head_dim", "model.mlp_dim",
                 "model.max_position", "data.max_length", "data.vocab_size", "eval_bleu_sentences",
                 "eval_bleu_per_language")
# Integer keys where 0 is allowed, with what 0 means.
NONNEGATIVE_KEYS = {"data.max_target_length": "0 = data.max_length", "eval_bleu_every": "0 = never",
                    "eval_every": "0 = never", "eval_batches": "0 = all", "optimizer.warmup_steps": "0 = none",
                    "data.min_eval_pairs": "0 = no minimum"}
RENAMED_VALUES = {"model.remat": {False: "none", True: "full"}}  # in older runs' config.json: old value -> today's
# Float keys: a finite number (nan and inf mean nothing here) in the range its test gives.
FLOAT_RANGES = {
    "optimizer.learning_rate": (lambda x: x > 0, "> 0"),
    "optimizer.grad_clip_norm": (lambda x: x >= 0, ">= 0 (0 = no clipping)"),
    "optimizer.weight_decay": (lambda x: x >= 0, ">= 0"),
    "optimizer.label_smoothing": (lambda x: 0 <= x < 1, "in [0, 1)"),
    "model.dropout_rate": (lambda x: 0 <= x < 1, "in [0, 1)"),
    "model.attention_dropout_rate": (lambda x: 0 <= x < 1, "in [0, 1)"),
    "data.dev_fraction": (lambda x: 0 <= x < 1, "in [0, 1)"),
    "data.test_fraction": (lambda x: 0 <= x < 1, "in [0, 1)"),
    "data.character_coverage": (lambda x: 0 < x <= 1, "in (0, 1]"),
}


def _where(path: pathlib.Path, error: BaseException) -> str:
  """`path:line` of the innermost place in the file `path` that `error` came from (just `path` if none)."""
  here = os.path.abspath(path)
  if isinstance(error, SyntaxError) and error.filename and os.path.abspath(error.filename) == here:
    return f"{path}:{error.lineno}"
  lines = [f.lineno for f in traceback.extract_tb(error.__traceback__) if os.path.abspath(f.filename) == here]
  return f"{path}:{lines[-1]}" if lines else str(path)


def run_file_code(path: str | pathlib.Path, function, *args, **kwargs):
  """Calls `function`, code of the user's Python file `path`: an exception it raises becomes one line naming the
  file, the line and the exception (`configs/x.py:12: ZeroDivisionError: division by zero`)."""
  try:
    return function(*args, **kwargs)
  except UserError:
    raise  # already one line naming what is at fault
  except Exception as e:  # noqa: BLE001 - any error of a user's file is the user's to fix
    detail = e.msg if isinstance(e, SyntaxError) else e  # its str() repeats the file and line
    raise ConfigError(f"{_where(pathlib.Path(path), e)}: {type(e).__name__}: {detail}") from None


def load_module(path: str | pathlib.Path, needs: str):
  """A Python file (a config or a sweep) as a module, which must define `needs`."""
  path = pathlib.Path(path)  # a Python file to import: local, as every import is
  if not path.is_file():
    raise ConfigError(f"{path}: file not found")
  spec = importlib.util.spec_from_file_location(f"_gshard_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  run_file_code(path, spec.loader.exec_module, module)
  if not hasattr(module, needs):
    raise ConfigError(f"{path} has no {needs}")
  return module


def load_file(path: str | pathlib.Path, **kwargs) -> ml_collections.ConfigDict:
  """`get_config(**kwargs)` of a config file."""
  return run_file_code(path, load_module(path, "get_config").get_config, **kwargs)


def upgrade(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Rewrites the old values of RENAMED_VALUES that `config` holds (in place)."""
  for key, renamed in RENAMED_VALUES.items():
    section, leaf = key.split(".")
    if isinstance(value := config.get(section, {}).get(leaf), bool):
      del config[section][leaf]  # a ConfigDict keeps each field's type: a bool cannot become a str
      config[section][leaf] = renamed[value]
  return config


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
      raise ConfigError(f"--config.{key}={text}: expected {article(type(current).__name__)}") from None
  if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if type(value) is not type(current):
    raise ConfigError(f"--config.{key}={text}: expected {article(type(current).__name__)}, got "
                      f"{article(type(value).__name__)}")
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


def validate(config: ml_collections.ConfigDict):
  """Raises ConfigError for an impossible combination, before anything is built or compiled (what depends on the
  devices too: `gshard_mt.parallel.mesh.check`)."""
  flat = flatten(config)
  for key, allowed in CHOICES.items():
    if flat.get(key) not in allowed:
      raise ConfigError(f"{key}={flat.get(key)!r}: expected one of {tuple(allowed)}")
  sources = str(config.data.source).split("+")
  if not all(s.partition(":")[0] in choices.SOURCES for s in sources) or len(set(sources)) != len(sources):
    raise ConfigError(f"data.source={config.data.source!r}: expected one of {choices.SOURCES.names()} (tfds:NAME for "
                      "a TFDS dataset), or several different ones joined with '+' (e.g. 'tatoeba+multi30k')")
  for key in POSITIVE_KEYS:
    if not _integer(flat[key]) or flat[key] <= 0:
      raise ConfigError(f"{key}={flat[key]!r}: expected a positive integer")
  for key, zero in NONNEGATIVE_KEYS.items():
    if not _integer(flat[key]) or flat[key] < 0:
      raise ConfigError(f"{key}={flat[key]!r}: expected an integer >= 0 ({zero})")
  for key, (test, expected) in FLOAT_RANGES.items():
    value = flat[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not test(value):
      raise ConfigError(f"{key}={value!r}: expected a finite number {expected}")
  if config.model.attention != "xla" and config.model.attention_dropout_rate:
    raise ConfigError(f"model.attention={config.model.attention!r} has no attention dropout: it needs "
                      f"model.attention_dropout_rate=0, "
                      f"not {config.model.attention_dropout_rate}")
  if config.optimizer.kernel == "pallas" and config.optimizer.name != "adafactor":
    raise ConfigError(f"optimizer.kernel='pallas' is Adafactor's update: it needs optimizer.name='adafactor', not "
                      f"{config.optimizer.name!r}")
  if config.batch_size % config.num_microbatches:
    raise ConfigError(f"num_microbatches={config.num_microbatches} does not divide batch_size={config.batch_size}")
  if not config.data.temperature > 0:
    raise ConfigError(f"data.temperature={config.data.temperature}: expected > 0 (inf for uniform)")
  _validate_moe(config)
  if error := moe_group_error(config):
    raise ConfigError(error)


def _integer(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _validate_moe(config):
  interval = config.model.moe_interval
  if interval < 0:
    raise ConfigError(f"model.moe_interval={interval}: expected >= 0 (0 = dense)")
  moe = MoeConfig.from_config(config.moe).validate(used=interval > 0)
  if interval and (name := moe.language_router()) and not config.data.source_tags:
    raise ConfigError(f"moe.router={name!r} routes by the source-language tag: it needs data.source_tags=True")
  for key in ("num_encoder_layers", "num_decoder_layers"):
    if interval and config.model[key] % interval:
      raise ConfigError(f"model.{key}={config.model[key]} is not a multiple of model.moe_interval={interval}")
  expert_axis = config.mesh.expert * config.dcn_mesh.expert
  model_axis = config.mesh.model * config.dcn_mesh.model
  if interval and moe.expert_kernel == "pallas" and config.partitioning == "expert_model" and model_axis > 1:
    raise ConfigError(f"moe.expert_kernel='pallas' needs each expert's H whole on a device: "
                      f"partitioning='expert_model' splits it over mesh.model={config.mesh.model}; use "
                      "moe.expert_kernel='xla', or mesh.model=1")
  if interval and expert_axis > 1 and moe.num_experts % expert_axis:
    raise ConfigError(f"moe.num_experts={moe.num_experts} is not divisible by the expert axis, "
                      f"mesh.expert={config.mesh.expert} x dcn_mesh.expert={config.dcn_mesh.expert}")


def microbatch_rows(config) -> int:
  """Rows of one microbatch: what each forward and backward pass of a training step sees."""
  return config.batch_size // config.num_microbatches


def row_lengths(config) -> tuple[int, int]:
  """(source, target) tokens per training row: data.max_length and data.max_target_length (0 = the same).
  Sources take ~1.6x the tokens of their English targets, so equal lengths leave target slots empty."""
  return config.data.max_length, config.data.max_target_length or config.data.max_length


def moe_group_error(config, group_devices: int = 1, group_size: int | None = None) -> str | None:
  """Why the MoE groups of a microbatch fail with `group_size` (default moe.group_size), in one line; None if
  they work. Each side's tokens must be whole groups (or, without microbatches, fewer tokens make one group) and
  the groups must split over `group_devices`, the devices of the mesh axes the rules give 'group'."""
  if not config.model.moe_interval:
    return None
  size, micro = group_size or config.moe.group_size, config.num_microbatches > 1
  batch, rows = ("microbatch", "batch_size / num_microbatches") if micro else ("batch", "batch_size")
  for key, length in zip(LENGTH_KEYS, row_lengths(config)):
    tokens = microbatch_rows(config) * length
    if tokens % size and (tokens > size or micro):
      return (f"moe.group_size={size} does not divide the {tokens} tokens of a {batch} "
              f"(batch_size={config.batch_size}{f' / num_microbatches={config.num_microbatches}' * micro} x "
              f"{key}={length})")
    if (groups := max(tokens // size, 1)) % group_devices:
      return (f"the {groups} MoE groups of a {batch} ({rows} x {key}={length} / moe.group_size) do not split "
              f"over the {group_devices} devices of the mesh axes the groups are split over; lower moe.group_size "
              "or raise batch_size")
  return None


def load(path, overrides: dict[str, str] | None = None) -> ml_collections.ConfigDict:
  config = apply_overrides(load_file(path), overrides or {})
  validate(config)
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


def save(config: ml_collections.ConfigDict, workdir: io.PathLike):
  """Writes workdir/config.json atomically; a resumed run must have the same model, moe and data keys."""
  path = io.path(workdir) / "config.json"
  if path.exists():
    # a key the run's config lacks is one added since: the run had its default's behaviour
    old = flatten(defaults.get_config()) | flatten(load_saved(workdir))
    new = flatten(config)
    changed = [k for k in new if k.split(".")[0] in ("model", "moe", "data") and old.get(k) != new[k]
               and k not in ("data.prefetch", "model.remat")]  # these two change no result
    if changed:
      raise ConfigError(f"{path} was written for a different run: " + ", ".join(
          f"{k}: {old.get(k)!r} -> {new[k]!r}" for k in changed) + "; use a new --workdir")
  path.parent.mkdir(parents=True, exist_ok=True)
  io.write_atomically(path, config.to_json(indent=2))


def load_saved(workdir: io.PathLike) -> ml_collections.ConfigDict:
  path = io.path(workdir) / "config.json"
  if not path.is_file():
    raise ConfigError(f"{path} not found: is {workdir} a gshard_mt work directory?")
  return upgrade(ml_collections.ConfigDict(json.loads(path.read_text())))

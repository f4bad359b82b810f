"""The config: `--config.key=value` overrides of a config file's ConfigDict, parsed into the frozen `Config`
(`sections`: every key's default and check). The package's leaf: it imports nothing else of gshard_mt;
`gshard_mt.cli.load` makes the one `Config` of a config file and its overrides, `gshard_mt.config_files` reads and
writes the files.

  python train.py --config configs/tiny.py --workdir runs/tiny --config.moe.num_experts=16
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
from typing import Any

import ml_collections

from gshard_mt.config import checks
from gshard_mt.config.errors import ConfigError, article
from gshard_mt.config.sections import SECTIONS, Config, microbatch_rows, moe_group_error, row_lengths  # noqa: F401

BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}  # of --config.key=TEXT


def _parse_value(key: str, text: str, current):
  """`text` as a value of the type of `current`."""
  if isinstance(current, bool):
    if text.lower() not in BOOLEANS:
      raise ConfigError(f"--config.{key}={text}: expected true or false")
    return BOOLEANS[text.lower()]
  if isinstance(current, str):
    return text
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    if text.lower() in ("inf", "infinity", "nan"):
      value = float(text.lower())
    else:
      raise ConfigError(f"--config.{key}={text}: expected {article(type(current).__name__)}") from None
  if not checks.is_a(value, type(current)):
    raise ConfigError(f"--config.{key}={text}: expected {article(type(current).__name__)}, got "
                      f"{article(type(value).__name__)}")
  return float(value) if isinstance(current, float) else value


def _apply_overrides(config: ml_collections.ConfigDict, overrides: dict[str, str]) -> ml_collections.ConfigDict:
  """A copy of `config` with the `key.sub=value` strings set, typed like the existing values (the copy keeps the
  file's field references: a key that refers to another follows it); an unknown key is an error."""
  config = copy.deepcopy(config)
  flat = flatten(config)
  for key, text in overrides.items():
    if key not in flat and (inside := [k for k in flat if k.startswith(f"{key}.")]):
      raise ConfigError(f"--config.{key}={text}: {key} is a section; set its keys, e.g. --config.{inside[0]}=...")
    if key not in flat:
      raise _unknown_key(key, flat)
    _set(config, key, _parse_value(key, text, flat[key]))
  return config


def _unknown_key(key: str, known, prefix: str = "") -> ConfigError:
  close = difflib.get_close_matches(key, list(known), n=3)
  return ConfigError(f"unknown config key {prefix + key!r}" + (f"; did you mean {', '.join(close)}?" if close else ""))


def _set(tree, key: str, value):
  """Sets the dotted `key` of a ConfigDict or nested dicts."""
  *parents, leaf = key.split(".")
  for name in parents:
    tree = tree[name]
  tree[leaf] = value


def flatten(config, prefix="") -> dict:
  """{'model.emb_dim': 512, ...} of a ConfigDict or nested dicts."""
  out = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict | dict):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def to_dict(config: Config | ml_collections.ConfigDict) -> dict:
  """Nested plain dicts of a `Config` or a config file's ConfigDict (the keys of config.json)."""
  return config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dataclasses.asdict(config)


def parse(config: ml_collections.ConfigDict | dict, overrides: dict[str, str] | None = None) -> Config:
  """A config file's ConfigDict, with its `--config.key=value` `overrides` set, as the frozen `Config`, every
  section checked: a wrong key, type or value, or a combination that cannot work, raises ConfigError naming the key,
  before anything is built. Keys missing (a config.json written before they were added) take their defaults."""
  if overrides:
    config = _apply_overrides(config, overrides)
  values = to_dict(config) if isinstance(config, ml_collections.ConfigDict) else dict(config)
  sections = {name: _typed(cls, values.pop(name, {}), f"{name}.") for name, cls in SECTIONS.items()}
  return _typed(Config, values | sections)


def _typed(cls, values: dict, prefix: str = ""):
  """`cls` made from `values`; an unknown key is an error."""
  fields = {f.name for f in dataclasses.fields(cls)}
  for key in values:
    if key not in fields:
      raise _unknown_key(key, fields, prefix)
  return cls(**values)


def replace(config: Config, values: dict[str, Any]) -> Config:
  """`config` with the dotted keys of `values` set (typed values, not text), checked as `parse` checks."""
  tree = to_dict(config)
  for key, value in values.items():
    _set(tree, key, value)
  return parse(tree)


def split_overrides(argv: list[str]) -> tuple[list[str], dict[str, str]]:
  """Separates `--config.key=value` (or `--config.key value`) arguments from the others."""
  rest, overrides, args = [], {}, iter(argv)
  for arg in args:
    if not arg.startswith("--config."):
      rest.append(arg)
      continue
    key, equals, value = arg.removeprefix("--config.").partition("=")
    if not equals and (value := next(args, None)) is None:
      raise ConfigError(f"{arg} needs a value")
    overrides[key] = value
  return rest, overrides

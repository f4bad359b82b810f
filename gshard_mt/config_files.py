"""Config files: a Python file's `get_config()` (its errors one line naming the file and line; `cli.load` adds the
`--config.key=value` overrides), and a work directory's config.json (written atomically, checked against the run it
belongs to, read back with the keys added since at their defaults)."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import traceback

import ml_collections

from gshard_mt import hints, io
from gshard_mt.config import Config, flatten, parse, platforms, to_dict
from gshard_mt.errors import ConfigError, UserError


def run_file_code(path: str | pathlib.Path, function, *args, **kwargs):
  """Calls `function`, code of the user's file `path`; what it raises becomes one line naming the file and its
  innermost line there (`configs/x.py:12: ZeroDivisionError: division by zero`)."""
  try:
    return function(*args, **kwargs)
  except UserError:
    raise  # already one line naming what is at fault
  except Exception as e:  # noqa: BLE001 - any error of a user's file is the user's to fix
    path, here = pathlib.Path(path), os.path.abspath(path)
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if os.path.abspath(f.filename) == here]
    if isinstance(e, SyntaxError) and e.filename and os.path.abspath(e.filename) == here:
      lines.append(e.lineno)
    detail = e.msg if isinstance(e, SyntaxError) else e  # its str() repeats the file and line
    raise ConfigError(f"{path}{f':{lines[-1]}' if lines else ''}: {type(e).__name__}: {detail}") from None


def load_module(path: str | pathlib.Path, needs: str):
  """A Python file (a config or a sweep) as a module, which must define `needs`."""
  path = pathlib.Path(path)  # local, as every import is
  if not path.is_file():
    raise ConfigError(f"{path}: file not found")
  spec = importlib.util.spec_from_file_location(f"_gshard_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  run_file_code(path, spec.loader.exec_module, module)
  if not hasattr(module, needs):
    raise ConfigError(f"{path} has no {needs}" + _what_it_is(path, module))
  return module


def _what_it_is(path: pathlib.Path, module) -> str:
  """The command a sweep file given as a config (or a config given as a sweep) is run with."""
  if hasattr(module, "get_sweep"):
    return f": it is a sweep (get_sweep); run it with {hints.command({'--sweep': str(path)}, program=hints.SWEEP)}"
  if hasattr(module, "get_config"):
    train = {"--config": str(path), "--workdir": f"runs/{path.stem}"}
    return f": it is a config; train it with {hints.command(train, program=hints.TRAIN)}"
  return ""


def load_file(path: str | pathlib.Path, **kwargs) -> ml_collections.ConfigDict:
  """`get_config(**kwargs)` of a config file."""
  return run_file_code(path, load_module(path, "get_config").get_config, **kwargs)


def check_same_run(config: Config, workdir: io.PathLike, *, started: bool = True):
  """A ConfigError unless a resumed run has the same model, moe and data keys as its config.json. `started`:
  whether the run has checkpoints; before the first, a run that failed (a wrong data.path) may start again
  changed."""
  path = io.path(workdir) / "config.json"
  if path.exists() and started:
    # a key added since the run started has its default (load_saved); prefetch, remat, the scan's unrolling, the
    # kernels and the evaluation's capacity change no parameter, nor do the `auto` options, so a run may move
    # between platforms
    old, new = flatten(to_dict(load_saved(workdir))), flatten(to_dict(config))
    same_run = ("data.prefetch", "model.remat", "model.scan_unroll", "moe.expert_kernel", "moe.grouped_kernel",
                "moe.eval_capacity_factor", *platforms.REFERENCE)
    changed = [k for k in new if k.split(".")[0] in ("model", "moe", "data") and old.get(k) != new[k]
               and k not in same_run]
    if changed:
      elsewhere = hints.command({"--workdir": hints.unused(workdir)})
      raise ConfigError(f"{path} was written for a different run: " + ", ".join(
          f"{k}: {old.get(k)!r} -> {new[k]!r}" for k in changed) + f"; to train this config, use a new work "
          f"directory: {elsewhere}")


def save(config: Config, workdir: io.PathLike, *, started: bool = True):
  """Writes workdir/config.json atomically, after `check_same_run`."""
  check_same_run(config, workdir, started=started)
  path = io.path(workdir) / "config.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  io.write_atomically(path, json.dumps(to_dict(config), indent=2))


def load_saved(workdir: io.PathLike, check=lambda config: config) -> Config:
  """The config.json of a work directory, parsed (keys added since take their defaults) and passed to `check`
  (`training.validate.load_saved` passes its names' and combinations' check), an error naming the file."""
  path = io.path(workdir) / "config.json"
  if not path.is_file():
    raise ConfigError(f"{path} not found: is {workdir} a gshard_mt work directory?")
  try:
    values = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ConfigError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); the run's config cannot be read") from None
  if isinstance(remat := values.get("model", {}).get("remat"), bool):  # older runs saved model.remat as a bool
    values["model"]["remat"] = "full" if remat else "none"
  try:
    return check(parse(values))
  except ConfigError as e:  # the value at fault is the file's, not the command line's
    raise ConfigError(f"{path}: {e} (in the run's saved config)") from None

"""What every command shares: logging, a config file with `--config.key=value` overrides, and the ways a command
ends in one line without a traceback: a user error (a bad config, corpus or work directory), exit status 2; a
storage fault (a full disk, a read-only or forbidden path) with the path and the free space, 74; Ctrl-C, 130."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Callable

from gshard_mt import compilation_cache, config_files, hints, io, xla_flags
from gshard_mt import config as config_lib
from gshard_mt.errors import UserError
from gshard_mt.training import validate

QUIET = ("absl", "jax._src.xla_bridge", "orbax")
READ_ONLY = "Given directory is read only"  # Orbax's warning on every read-only checkpoint manager (eval.py's)


def setup_logging():
  """INFO logging, without the tracebacks of a storage fault from Orbax's and TensorStore's threads: the command
  ends with its own line about it."""
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  for name in QUIET:
    logging.getLogger(name).setLevel(logging.WARNING)
  logging.getLogger("absl").addFilter(lambda record: not record.getMessage().startswith(READ_ONLY))
  for handler in logging.getLogger().handlers:
    handler.addFilter(lambda record: not (record.exc_info and io.storage_fault(record.exc_info[1])))
  report = threading.excepthook
  threading.excepthook = lambda args: None if io.storage_fault(args.exc_value) else report(args)


class ArgumentParser(argparse.ArgumentParser):
  def error(self, message):  # one line, as every other error ends (argparse's own prints its usage first)
    self.exit(2, f"{self.prog}: error: {message} ({hints.command({'--help': True}, keep=False)} lists the "
                 "arguments)\n")


def parser(doc: str, *, config: bool = False) -> argparse.ArgumentParser:
  """An argument parser showing the module docstring; with config=True it has --config (a config file)."""
  p = ArgumentParser(prog=hints.program(), description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
  if config:
    p.add_argument("--config", required=True, help="a Python config file with get_config()")
  # here for --help: `run` takes it out of the arguments before main parses them, as it must act before any compile
  p.add_argument(compilation_cache.FLAG, metavar="DIR|off",
                 help=f"JAX's persistent compilation cache (default: ${compilation_cache.SWITCH}, else "
                      f"{compilation_cache.default_folder().replace(os.path.expanduser('~'), '~')})")
  return p


def load(path, overrides: dict[str, str] | None = None) -> config_lib.Config:
  """The one frozen `Config` of the config file `path` with its `--config.key=value` overrides, validated
  (`validate.check`: each value, name and combination), before anything is read or compiled."""
  return validate.check(config_lib.parse(config_files.load_file(path), overrides))


def parse_with_overrides(p: argparse.ArgumentParser, argv: list[str]):
  """(args, config): the parsed arguments, and the config file loaded with its `--config.key=value` overrides
  (`load`)."""
  rest, overrides = config_lib.split_overrides(argv)
  args = p.parse_args(rest)
  return args, load(args.config, overrides)


def run(main: Callable[[list[str]], object], argv: list[str] | None = None, cache: bool = True):
  """Runs main(argv) with logging, the compiler flags (`xla_flags`) and the compilation cache (off with cache=False,
  for the tools that measure compile time); ends a UserError, a storage fault or Ctrl-C in one line, naming the command
  as `parser`'s usage errors name it (`hints.program()`)."""
  setup_logging()
  xla_flags.apply()
  xla_flags.quiet_tpu_host_lookup()
  prog = hints.program()
  argv, cache_flag = compilation_cache.take_flag(sys.argv[1:] if argv is None else argv)
  try:
    compilation_cache.setup(cache_flag if cache else "off")
    return main(argv)
  except UserError as e:
    print(f"{prog}: error: {e}", file=sys.stderr)
    sys.exit(2)
  except KeyboardInterrupt:
    print(f"{prog}: interrupted", file=sys.stderr)
    sys.exit(130)
  except BaseException as e:
    fault = io.storage_fault(e)
    if fault is None:
      raise
    print(f"{prog}: error: {io.describe_fault(fault)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # At once: a checkpointer's or data loader's threads may still wait on the storage that failed.
    os._exit(io.STORAGE_EXIT_CODE)

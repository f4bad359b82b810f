"""What eval.py and translate.py share on their command lines: the decoding flags and their one check, and the
process layout on several hosts (`--config.distributed.*`; the rest of the config is the work directory's).

  python eval.py --workdir gs://bucket/run --config.distributed.auto=true   # the same command on every host
"""

from __future__ import annotations

import argparse

from gshard_mt import config as config_lib
from gshard_mt.config import defaults
from gshard_mt.errors import ConfigError, UserError

BEAM_SIZE, ALPHA = 4, 0.6  # the standard evaluation's decoding (eval/<split>-<step>/, `outputs.output_name`)
# The smallest value of each numeric flag (a flag left at its default, None, is not checked). A negative alpha
# would reward length, and the beam search's early stop bounds a live beam's score only for alpha >= 0.
MINIMUM = {"beam_size": 1, "max_decode_len": 1, "batch_size": 1, "average_last": 1, "bootstrap": 0, "alpha": 0}
DISTRIBUTED = "distributed."


def add_decoding_flags(p: argparse.ArgumentParser, verb: str):
  """--step, --beam_size, --alpha, --max_decode_len, --batch_size and --average_last; `verb` ('decode',
  'translate') says what --average_last's mean parameters do."""
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
  p.add_argument("--beam_size", type=int, default=BEAM_SIZE)
  p.add_argument("--alpha", type=float, default=ALPHA, help="length penalty ((5 + len) / 6) ** alpha")
  p.add_argument("--max_decode_len", type=int, default=None, help="default: the config's data.max_length")
  p.add_argument("--batch_size", type=int, default=None, help="sentences per batch (default: batch_size)")
  p.add_argument("--average_last", type=int, default=None,
                 help=f"{verb} with the mean parameters of the last N checkpoints (up to and including --step)")


def check(**values):
  """A UserError naming the first flag below its minimum (`MINIMUM`), before anything is loaded."""
  for name, value in values.items():
    if value is not None and not value >= MINIMUM[name]:  # NaN too
      raise UserError(f"--{name} must be at least {MINIMUM[name]}, got {value}")


def parse(p: argparse.ArgumentParser, argv: list[str]):
  """(the checked arguments, a default config with the `--config.distributed.*` overrides): the saved config's
  process layout is the training run's."""
  rest, overrides = config_lib.split_overrides(argv)
  args = p.parse_args(rest)
  check(**{name: getattr(args, name) for name in MINIMUM if hasattr(args, name)})
  others = [key for key in overrides if not key.startswith(DISTRIBUTED)]
  if others:
    raise ConfigError(f"--config.{others[0]}: only --config.{DISTRIBUTED}* may be given here; the model, data and "
                      "mesh are those of the work directory's config.json")
  return args, config_lib.parse(defaults.get_config(), overrides)

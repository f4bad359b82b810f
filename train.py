"""Train a GShard MoE translation model.

  python train.py --config configs/tiny.py --workdir runs/tiny [--config.moe.num_experts=16 ...]

See README.md for what it prints and writes. The logic lives in gshard_mt/train.py.
"""

import argparse
import logging
import sys

from gshard_mt import config as config_lib


def main(argv):
  args, overrides = config_lib.split_overrides(argv)
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="a Python config file with get_config()")
  parser.add_argument("--workdir", required=True, help="checkpoints, metrics, tokenizer and config go here")
  parsed = parser.parse_args(args)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  for noisy in ("absl", "jax._src.xla_bridge", "orbax"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  try:
    config = config_lib.load(parsed.config, overrides)
  except config_lib.ConfigError as e:
    sys.exit(f"config error: {e}")
  from gshard_mt import partitioning, train  # after the config checks: importing JAX takes a moment

  partitioning.initialize_distributed(config)

  result = train.train_and_evaluate(config, parsed.workdir)
  print(f"done: step {result['step']}" + (f", dev loss {result['dev_loss']:.3f}" if "dev_loss" in result else ""))


if __name__ == "__main__":
  main(sys.argv[1:])

"""Train a GShard MoE translation model.

  python train.py --config configs/tiny.py --workdir runs/tiny [--config.moe.num_experts=16 ...]

See README.md for what it prints and writes. The logic lives in gshard_mt/training/loop.py.
"""

from gshard_mt import cli


def main(argv):
  p = cli.parser(__doc__, config=True)
  p.add_argument("--workdir", required=True, help="checkpoints, metrics, tokenizer and config go here")
  args, config = cli.parse_with_overrides(p, argv)
  import jax  # after the config checks

  from gshard_mt.parallel import distributed
  from gshard_mt.training import loop

  distributed.initialize_distributed(config)
  result = loop.train_and_evaluate(config, args.workdir)
  print(f"done: step {result['step']}" + (f", dev loss {result['dev_loss']:.3f}" if "dev_loss" in result else ""))
  if jax.process_index() == 0:
    from gshard_mt.tools import plot

    print("wrote " + ", ".join(str(p) for p in plot.plot_run(args.workdir)))


if __name__ == "__main__":
  cli.run(main, prog="train.py")

"""Train a GShard MoE translation model.

  python train.py --config configs/tiny.py --workdir runs/tiny [--config.moe.num_experts=16 ...]

See README.md for what it prints and writes. The logic lives in gshard_mt/training/loop.py.
"""

import contextlib

from gshard_mt import cli, hints, io, tidy


def main(argv):
  p = cli.parser(__doc__, config=True)
  p.add_argument("--workdir", required=True, help="checkpoints, metrics, tokenizer and config go here")
  args, config = cli.parse_with_overrides(p, argv)
  import jax  # after the config checks

  from gshard_mt.evaluation import report
  from gshard_mt.parallel import distributed
  from gshard_mt.training import loop

  distributed.initialize_distributed(config)
  # A start that fails (refused, interrupted) leaves the work directory as it found it: not made, no empty folder.
  with tidy.left_as_found(args.workdir) if jax.process_index() == 0 else contextlib.nullcontext():
    # Before any data is read: a work directory that cannot be created or written ends here, in one line (exit 74).
    distributed.checked_on_process_0(lambda: io.check_writable(args.workdir, "work directory"))
    result = loop.train_and_evaluate(config, args.workdir)
  print(f"done: step {result['step']}" + (f", dev loss {result['dev_loss']:.3f}" if "dev_loss" in result else ""))
  if result.get("dev_bleu_greedy") is not None and (
      note := report.not_translating(result["dev_bleu_greedy"], "its greedy dev BLEU")):
    print(note)
  if "loss" not in result and result["step"] >= config.num_train_steps:  # no step ran: the run had finished
    longer = {"--config.num_train_steps": str(2 * result["step"])}
    print(f"{args.workdir} is trained to num_train_steps={config.num_train_steps} already; to train it longer (here "
          f"to twice as many steps; any number above {result['step']} will do): {hints.command(longer)}")
  if jax.process_index() == 0:
    from gshard_mt.tools import plot

    print("wrote " + ", ".join(str(p) for p in plot.plot_run(args.workdir)))


if __name__ == "__main__":
  cli.run(main)

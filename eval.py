"""Evaluate a trained work directory: BLEU and chrF++ per language, with beam search.

  python eval.py --workdir runs/tiny [--split dev|test] [--step N] [--beam_size 4] [--alpha 0.6]
                 [--max_decode_len N] [--languages fra,deu] [--baseline runs/dense] [--bootstrap 1000]
                 [--average_last N] [--config.distributed.KEY=VALUE ...]

On several hosts run the same command on each, with the process layout as train.py takes it
(--config.distributed.auto=true, or coordinator_address, num_processes and process_id): every process decodes
its rows of each batch on the work directory's mesh; process 0 alone scores, prints and writes.
See README.md for what it prints and writes. The logic lives in gshard_mt/evaluation/evaluate.py.
"""

from gshard_mt import cli


def main(argv):
  from gshard_mt.evaluation import flags

  p = cli.parser(__doc__)
  p.add_argument("--workdir", required=True)
  p.add_argument("--split", default="test", choices=("dev", "test"))
  flags.add_decoding_flags(p, "decode")
  p.add_argument("--languages", default="", help="comma-separated codes (default: all)")
  p.add_argument("--baseline", default=None, help="a work directory evaluated on the same split")
  p.add_argument("--bootstrap", type=int, default=0, help="paired bootstrap samples against --baseline")
  args, config = flags.parse(p, argv)
  from gshard_mt.evaluation import evaluate, report
  from gshard_mt.parallel import distributed

  distributed.initialize_distributed(config)
  languages = [lang.strip() for lang in args.languages.split(",") if lang.strip()] or None
  scores = evaluate.evaluate(args.workdir, split=args.split, step=args.step, beam_size=args.beam_size,
                             alpha=args.alpha, max_decode_len=args.max_decode_len, languages=languages,
                             baseline=args.baseline, batch_size=args.batch_size, bootstrap_samples=args.bootstrap,
                             average_last=args.average_last)
  if scores is not None:  # process 0
    print(report.summary(scores))
    print(f"wrote {scores['output_dir']}/ (scores.json, report.md, bleu_by_language.png, hyp.<lang>.txt)")


if __name__ == "__main__":
  cli.run(main)

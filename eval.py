"""Evaluate a trained work directory: BLEU and chrF++ per language, with beam search.

  python eval.py --workdir runs/tiny [--split dev|test] [--step N] [--beam_size 4] [--alpha 0.6]
                 [--max_decode_len N] [--languages fra,deu] [--baseline runs/dense] [--bootstrap 1000]
                 [--average_last N]

See README.md for what it prints and writes. The logic lives in gshard_mt/evaluation/evaluate.py.
"""

from gshard_mt import cli


def main(argv):
  p = cli.parser(__doc__)
  p.add_argument("--workdir", required=True)
  p.add_argument("--split", default="test", choices=("dev", "test"))
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
  p.add_argument("--beam_size", type=int, default=4)
  p.add_argument("--alpha", type=float, default=0.6, help="length penalty ((5 + len) / 6) ** alpha")
  p.add_argument("--max_decode_len", type=int, default=None, help="default: the config's data.max_length")
  p.add_argument("--languages", default="", help="comma-separated codes (default: all)")
  p.add_argument("--baseline", default=None, help="a work directory evaluated on the same split")
  p.add_argument("--batch_size", type=int, default=None, help="sentences per batch (default: batch_size)")
  p.add_argument("--bootstrap", type=int, default=0, help="paired bootstrap samples against --baseline")
  p.add_argument("--average_last", type=int, default=None,
                 help="decode with the mean parameters of the last N checkpoints (up to and including --step)")
  args = p.parse_args(argv)
  from gshard_mt.evaluation import evaluate, report

  languages = [lang.strip() for lang in args.languages.split(",") if lang.strip()] or None
  scores = evaluate.evaluate(args.workdir, split=args.split, step=args.step, beam_size=args.beam_size,
                             alpha=args.alpha, max_decode_len=args.max_decode_len, languages=languages,
                             baseline=args.baseline, batch_size=args.batch_size, bootstrap_samples=args.bootstrap,
                             average_last=args.average_last)
  print(report.summary(scores))
  print(f"wrote {scores['output_dir']}/ (scores.json, report.md, bleu_by_language.png, hyp.<lang>.txt)")


if __name__ == "__main__":
  cli.run(main, prog="eval.py")

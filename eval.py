"""Evaluate a trained work directory: BLEU and chrF++ per language, with beam search.

  python eval.py --workdir runs/tiny [--split dev|test] [--step N] [--beam_size 4] [--alpha 0.6]
                 [--max_decode_len N] [--languages fra,deu] [--baseline runs/dense] [--bootstrap 1000]

See README.md for what it prints and writes. The logic lives in gshard_mt/evaluate.py.
"""

import argparse
import logging
import sys


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--split", default="test", choices=("dev", "test"))
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--alpha", type=float, default=0.6, help="length penalty ((5 + len) / 6) ** alpha")
  parser.add_argument("--max_decode_len", type=int, default=None, help="default: the config's data.max_length")
  parser.add_argument("--languages", default="", help="comma-separated codes (default: all)")
  parser.add_argument("--baseline", default=None, help="a work directory evaluated on the same split")
  parser.add_argument("--batch_size", type=int, default=None, help="sentences per batch (default: batch_size)")
  parser.add_argument("--bootstrap", type=int, default=0, help="paired bootstrap samples against --baseline")
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  for noisy in ("absl", "jax._src.xla_bridge", "orbax"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  from gshard_mt import config as config_lib, evaluate, report
  from gshard_mt.data.corpus import DataError

  languages = [lang.strip() for lang in args.languages.split(",") if lang.strip()] or None
  try:
    scores = evaluate.evaluate(args.workdir, split=args.split, step=args.step, beam_size=args.beam_size,
                               alpha=args.alpha, max_decode_len=args.max_decode_len, languages=languages,
                               baseline=args.baseline, batch_size=args.batch_size, bootstrap_samples=args.bootstrap)
  except (evaluate.EvalError, config_lib.ConfigError, DataError) as e:
    sys.exit(f"eval error: {e}")
  print(report.summary(scores))
  print(f"wrote {scores['output_dir']}/ (scores.json, report.md, bleu_by_language.png, hyp.<lang>.txt)")


if __name__ == "__main__":
  main(sys.argv[1:])

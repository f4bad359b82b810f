"""Decoding speed of a trained work directory: sentences/s and tokens/s of greedy and beam search.

  python bench/decode.py --workdir runs/tiny [--split test] [--sentences 2000] [--beams 1,4] [--repeats 3]

Decodes the same sentences of the split (the first --sentences of a fixed shuffle, all languages) as eval.py does
(similar lengths batched together, `batch_size` sentences per batch, compiled before timing), --repeats times
per beam size, and prints the median; the ratio column is against greedy search timed in the same process.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gshard_mt import cli  # noqa: E402
from gshard_mt.evaluation import decode, evaluate  # noqa: E402


def main(argv):
  parser = cli.parser(__doc__)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--split", default="test", choices=("dev", "test"))
  parser.add_argument("--sentences", type=int, default=2000, help="0 = the whole split")
  parser.add_argument("--beams", default="1,4")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--alpha", type=float, default=0.6)
  args = parser.parse_args(argv)
  run = evaluate.restore(args.workdir, split=args.split)
  n = len(run.data.tokens[args.split])
  ids = np.random.default_rng(0).permutation(n)[: args.sentences or n]
  rows = []
  for beam in (int(b) for b in args.beams.split(",")):
    translator = decode.Translator(run.model_cfg, run.params, beam, args.alpha, run.config.data.max_length)
    speeds = []
    for _ in range(args.repeats):
      _, speed = evaluate.decode_pairs(translator, run, split=args.split, ids=ids, rows=run.config.batch_size,
                                       progress=False)
      speeds.append(speed)
    seconds = statistics.median(s["seconds"] for s in speeds)
    row = {"beam": beam, "sentences": len(ids), "median_s": round(seconds, 3),
           "sentences_per_s": round(len(ids) / seconds, 1),
           "tokens_per_s": round(statistics.median(s["tokens"] / s["seconds"] for s in speeds), 1)}
    rows.append(row)
    print(json.dumps(row), flush=True)
  print(f"\n{args.workdir} step {run.step}, {args.split} split, {len(ids)} sentences, {args.repeats} repeats\n")
  print("| beam | median s | sentences/s | tokens/s | time vs greedy |\n|---|---|---|---|---|")
  for row in rows:
    print(f"| {row['beam']} | {row['median_s']} | {row['sentences_per_s']} | {row['tokens_per_s']} | "
          f"{row['median_s'] / rows[0]['median_s']:.2f}x |")


if __name__ == "__main__":
  cli.run(main, prog="bench/decode.py")

"""Input pipeline throughput from one host process: packed real tokens per second, after the one-time
tokenizer training and tokenization (which are timed too).

  python bench/input_pipeline.py [--config configs/base.py] [--batches 200] [--repeats 5]

Prints one JSON line per measurement, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gshard_mt import config as config_lib  # noqa: E402
from gshard_mt.data import pipeline  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/base.py")
  parser.add_argument("--batches", type=int, default=200)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  config = config_lib.load(args.config)
  rows = []
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    pipeline.load(config, workdir)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    data = pipeline.load(config, workdir)
    warm = time.perf_counter() - start
  rows.append({"measure": "first load: corpus + tokenizer training + tokenization", "seconds": round(cold, 2)})
  rows.append({"measure": "later load (cached tokenizer and tokens)", "seconds": round(warm, 2)})

  def run(prefetched: bool):
    batches = data.train_batches(config)
    stream = pipeline.prefetch(batches, 4) if prefetched else batches
    next(stream)  # warm-up
    start, tokens = time.perf_counter(), 0
    for _ in range(args.batches):
      _, b = next(stream)
      tokens += int((b["inputs_segmentation"] > 0).sum() + (b["targets_segmentation"] > 0).sum())
    return tokens / (time.perf_counter() - start), batches.packing_efficiency

  for prefetched in (False, True):
    results = [run(prefetched) for _ in range(args.repeats)]
    rate = statistics.median(r[0] for r in results)
    rows.append({"measure": f"packed tokens/s{' (background thread)' if prefetched else ''}",
                 "tokens_per_s": round(rate), "batch": f"{config.batch_size}x{config.data.max_length}",
                 "packing_efficiency": round(results[0][1], 3)})
  for r in rows:
    print(json.dumps({**r, "config": args.config, "cpus": os.cpu_count()}))
  print(f"\n{args.config}, {os.cpu_count()} CPUs, median of {args.repeats} runs of {args.batches} batches")
  for r in rows:
    value = f"{r['seconds']} s" if "seconds" in r else f"{r['tokens_per_s']:,} tokens/s " \
        f"(packing efficiency {r['packing_efficiency']})"
    print(f"| {r['measure']} | {value} |")


if __name__ == "__main__":
  main()

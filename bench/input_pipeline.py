"""Input pipeline throughput from one host process: packed real tokens per second and packing efficiency, after
the one-time tokenizer training and tokenization (which are timed too).

  python bench/input_pipeline.py [--config configs/base.py] [--batches 200] [--repeats 5] [--target_length 40 ...]

Packing efficiency is real tokens / slots (both sides); its bound is the most that any packing of pairs sampled at
the rates reaches on average at these row lengths. `--target_length` packs target rows of each length given instead
of data.max_length (sources are longer than targets, so equal lengths leave target slots empty). Length bias: mean
source length of the packed pairs / of the sampled ones (1 when packing does not favour short or long pairs).
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
  parser.add_argument("--target_length", type=int, nargs="+", help="target tokens per row (default: data.max_length)")
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

  def run(lengths: tuple[int, int], prefetched: bool):
    batches = pipeline.TrainBatches(data.tokens["train"], data.rates, config.batch_size, lengths, config.data.seed)
    stream = pipeline.prefetch(batches, 4) if prefetched else batches
    next(stream)  # warm-up
    start, tokens, src_tokens, pairs = time.perf_counter(), 0, 0, 0
    for _ in range(args.batches):
      _, b = next(stream)
      src = int((b["inputs_segmentation"] > 0).sum())
      tokens += src + int((b["targets_segmentation"] > 0).sum())
      src_tokens += src
      pairs += int(((b["inputs_position"] == 0) & (b["inputs_segmentation"] > 0)).sum())
    length_bias = src_tokens / pairs / (batches.rates @ batches.mean_lengths[0])
    return tokens / (time.perf_counter() - start), batches.packing_efficiency, batches.efficiency_bound, length_bias

  for target_length in args.target_length or [config.data.max_length]:
    lengths = (config.data.max_length, target_length)
    for prefetched in (False, True):
      results = [run(lengths, prefetched) for _ in range(args.repeats)]
      rate = statistics.median(r[0] for r in results)
      rows.append({"measure": f"{lengths[0]} / {lengths[1]} tokens: packed tokens/s"
                              f"{' (background thread)' if prefetched else ''}",
                   "tokens_per_s": round(rate), "packing_efficiency": round(results[0][1], 3),
                   "efficiency_bound": round(results[0][2], 3), "length_bias": round(results[0][3], 4)})
  for r in rows:
    print(json.dumps({**r, "config": args.config, "rows": config.batch_size, "cpus": os.cpu_count()}))
  print(f"\n{args.config}, {config.batch_size} rows of source / target tokens, {os.cpu_count()} CPUs, "
        f"median of {args.repeats} runs of {args.batches} batches")
  for r in rows:
    value = f"{r['seconds']} s" if "seconds" in r else f"{r['tokens_per_s']:,} tokens/s (packing efficiency " \
        f"{r['packing_efficiency']}, bound {r['efficiency_bound']}, length bias {r['length_bias']})"
    print(f"| {r['measure']} | {value} |")


if __name__ == "__main__":
  main()

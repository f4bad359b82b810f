"""Input pipeline throughput from one host process: packed real tokens per second and packing efficiency, after
the one-time tokenizer training and tokenization (which are timed too).

  python bench/input_pipeline.py [--config configs/base.py] [--batches 200] [--repeats 5] [--target_length 40 ...]
                                 [--config.key=value ...]

Packing efficiency is real tokens / slots (both sides); its bound is the most that any packing of pairs sampled at
the rates reaches on average at these row lengths. `--target_length` packs target rows of each length given instead
of the config's (data.max_target_length; sources are longer than targets, so equal lengths leave target slots
empty), and `--config.key=value` changes the config (e.g. batch_size, data.max_length). Length bias: mean
source length of the packed pairs / of the sampled ones (1 when packing does not favour short or long pairs).
Rate error (with data.source_tags): the root mean square over languages of (packed pairs' frequency - sampling
rate) / the standard error of that frequency in as many independent draws at the rates; about 1 when packing
keeps the rates as well as sampling itself does.
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

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gshard_mt import cli  # noqa: E402
from gshard_mt import config as config_lib  # noqa: E402
from gshard_mt.data import pipeline  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/base.py")
  parser.add_argument("--batches", type=int, default=200)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--target_length", type=int, nargs="+",
                      help="target tokens per row (default: the config's, data.max_target_length)")
  rest, overrides = config_lib.split_overrides(sys.argv[1:])
  args = parser.parse_args(rest)
  config = cli.load(args.config, overrides)
  source_length, configured_target = config_lib.row_lengths(config)
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

  split = data.tokens["train"]
  tags = np.array([data.tokenizer.tag_id(s) for s in split.languages]) if config.data.source_tags else None

  def rate_error(batches: pipeline.TrainBatches, first_tokens: np.ndarray) -> float | None:
    if tags is None:
      return None
    size = max(tags.max(), first_tokens.max()) + 1
    p = np.bincount(tags, batches.rates, size)  # streams of one language share its tag
    n = len(first_tokens)
    used = p > 0
    z = (np.bincount(first_tokens, minlength=size)[used] / n - p[used]) / np.sqrt(p[used] * (1 - p[used]) / n)
    return float(np.sqrt(np.mean(z**2)))

  def run(lengths: tuple[int, int], prefetched: bool):
    batches = pipeline.TrainBatches(data.tokens["train"], data.rates, config.batch_size, lengths, config.data.seed)
    stream = pipeline.prefetch(batches, 4) if prefetched else batches
    next(stream)  # warm-up
    start, tokens, src_tokens, first_tokens = time.perf_counter(), 0, 0, []
    for _ in range(args.batches):
      _, b = next(stream)
      src = int((b["inputs_segmentation"] > 0).sum())
      tokens += src + int((b["targets_segmentation"] > 0).sum())
      src_tokens += src
      first_tokens.append(b["inputs"][(b["inputs_position"] == 0) & (b["inputs_segmentation"] > 0)])
    seconds = time.perf_counter() - start
    first_tokens = np.concatenate(first_tokens)
    length_bias = src_tokens / len(first_tokens) / (batches.rates @ batches.mean_lengths[0])
    return (tokens / seconds, batches.packing_efficiency, batches.efficiency_bound, length_bias,
            rate_error(batches, first_tokens))

  for target_length in args.target_length or [configured_target]:
    lengths = (source_length, target_length)
    for prefetched in (False, True):
      results = [run(lengths, prefetched) for _ in range(args.repeats)]
      rate = statistics.median(r[0] for r in results)
      rows.append({"measure": f"{lengths[0]} / {lengths[1]} tokens: packed tokens/s"
                              f"{' (background thread)' if prefetched else ''}",
                   "tokens_per_s": round(rate), "packing_efficiency": round(results[0][1], 3),
                   "efficiency_bound": round(results[0][2], 3), "length_bias": round(results[0][3], 4),
                   "rate_error": results[0][4] and round(results[0][4], 2)})
  for r in rows:
    print(json.dumps({**r, "config": args.config, "overrides": overrides, "rows": config.batch_size,
                      "cpus": os.cpu_count()}))
  print(f"\n{args.config}, {config.batch_size} rows of source / target tokens, {os.cpu_count()} CPUs, "
        f"median of {args.repeats} runs of {args.batches} batches")
  for r in rows:
    value = f"{r['seconds']} s" if "seconds" in r else f"{r['tokens_per_s']:,} tokens/s (packing efficiency " \
        f"{r['packing_efficiency']}, bound {r['efficiency_bound']}, length bias {r['length_bias']}, rate error " \
        f"{r['rate_error']})"
    print(f"| {r['measure']} | {value} |")


if __name__ == "__main__":
  main()

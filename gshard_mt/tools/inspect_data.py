"""Prints what the input pipeline makes of a config: pairs per language, sampling rates, token lengths,
packing efficiency and a few decoded training pairs.

  python -m gshard_mt.tools.inspect_data --config configs/tiny.py [--workdir runs/tiny] [--config.data.temperature=1]
"""

from __future__ import annotations

import numpy as np

from gshard_mt import cli
from gshard_mt import config as config_lib
from gshard_mt.data import pipeline


def main(argv):
  parser = cli.parser(__doc__, config=True)
  parser.add_argument("--workdir", default="runs/inspect", help="where the tokenizer is cached")
  parser.add_argument("--examples", type=int, default=5)
  parsed, config = cli.parse_with_overrides(parser, argv)
  data = pipeline.load(config, parsed.workdir)
  tokens = data.tokens["train"]
  print(f"{data.info['languages']} languages, {data.info['train_pairs']} train / {data.info['dev_pairs']} dev / "
        f"{data.info['test_pairs']} test pairs; vocabulary {data.tokenizer.vocab_size} ({data.tokenizer.path})")
  print(f"\n{'lang':6}{'train':>8}{'dev':>6}{'test':>6}{'rate %':>8}{'proportional %':>16}")
  total = data.info["train_pairs"]
  for lang in sorted(data.text["train"], key=lambda stream: -len(data.text["train"][stream])):
    n = len(data.text["train"][lang])
    print(f"{lang:6}{n:>8}{len(data.text['dev'][lang]):>6}{len(data.text['test'][lang]):>6}"
          f"{100 * data.rates[lang]:>8.2f}{100 * n / total:>16.2f}")
  for side, lengths in (("source", tokens.src_len), ("target", tokens.tgt_len)):
    p = np.percentile(lengths, [50, 90, 99, 100])
    print(f"{side} tokens: median {p[0]:.0f}, p90 {p[1]:.0f}, p99 {p[2]:.0f}, max {p[3]:.0f}")
  batches = data.train_batches(config)
  for i in range(20):
    batches.batch(i)
  source, target = config_lib.row_lengths(config)
  print(f"training rows: {source} source / {target} target tokens (data.max_length, data.max_target_length); "
        f"pairs longer on either side (filtered): {batches.filtered}; packing efficiency "
        f"{100 * batches.packing_efficiency:.1f}% of {config.batch_size} x ({source} + {target}) slots "
        f"(bound {100 * batches.efficiency_bound:.1f}%)")
  batch = batches.batch(0)
  print("\nexamples from the first training batch:")
  for k in range(min(parsed.examples, int(batch["inputs_segmentation"][0].max()))):
    src = batch["inputs"][0][batch["inputs_segmentation"][0] == k + 1]
    tgt = batch["targets"][0][batch["targets_segmentation"][0] == k + 1]
    tag = data.tokenizer.piece(int(src[0])) if config.data.source_tags or data.tokenizer.tags_every_source else ""
    print(f"  {tag} {data.tokenizer.decode(src)}\n      -> {data.tokenizer.decode(tgt)}")


if __name__ == "__main__":
  cli.run(main)

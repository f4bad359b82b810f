"""Prepares a config's corpus once: reads the sources, trains the tokenizer on a sample, tokenizes in parallel
processes and writes the memory-mapped shards that training reads (train.py does the same when they are missing),
then the sampler's index for the config's row lengths.

  python -m gshard_mt.tools.prepare_data --config configs/tiny.py --workdir runs/tiny [--processes N]
      [--config.data.prepared_dir=gs://bucket/prepared ...]
  make prepare CONFIG=configs/tiny.py WORKDIR=runs/tiny

The shards go to <workdir>/tokenizer/spm-<V>-<key>/, or under data.prepared_dir, where runs with the same data and
tokenizer settings share them; a corpus prepared already is found at once and not prepared again.
"""

from __future__ import annotations

import time

from gshard_mt import cli, tidy
from gshard_mt.data import pipeline
from gshard_mt.data import prepare as prepare_lib


def main(argv):
  parser = cli.parser(__doc__, config=True)
  parser.add_argument("--workdir", required=True, help="the run's work directory (unless data.prepared_dir is set, "
                      "the shards go to <workdir>/tokenizer)")
  parser.add_argument("--processes", type=int, default=0,
                      help="processes that read and tokenize (default: one per core, one for a small corpus)")
  args, config = cli.parse_with_overrides(parser, argv)
  start = time.perf_counter()
  with tidy.left_as_found(prepare_lib.root(config.data, args.workdir)):  # a failure leaves no empty folder behind
    directory = prepare_lib.ensure(config.data, args.workdir, args.processes or None)
  data = pipeline.load(config, args.workdir, directory.name)
  batches = data.train_batches(config)
  info = data.info
  print(f"{directory}: {info['languages']} streams, {info['train_pairs']} train / {info['dev_pairs']} dev / "
        f"{info['test_pairs']} test pairs, vocabulary {data.tokenizer.vocab_size}; {batches.filtered} training pairs "
        f"longer than the rows' {batches.lengths[0]} / {batches.lengths[1]} tokens left out "
        f"[{time.perf_counter() - start:.1f} s]")


if __name__ == "__main__":
  cli.run(main)

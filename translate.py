"""Translate sentences with a trained work directory: one line in, its English translation out, in input order.

  python translate.py --workdir runs/tiny [--step N] [--src_lang fra] [--beam_size 4] [--alpha 0.6]
                      [--average_last N] [--input FILE] [--output FILE] [--batch_size N] [--max_decode_len N]
                      [--config.distributed.KEY=VALUE ...]
  python translate.py --workdir runs/tiny --list_languages     # the source languages it knows, one a line

Lines are `text`, or `lang<TAB>text` when languages are mixed (--src_lang: the language of lines without a tab).
On several hosts run the same command on each (--config.distributed.*, as eval.py): process 0 reads the input and
writes the translations. See README.md. The logic lives in gshard_mt/tools/translate.py.
"""

import logging
import os
import sys

from gshard_mt import cli


def main(argv):
  from gshard_mt.evaluation import flags

  p = cli.parser(__doc__)
  p.add_argument("--workdir", required=True)
  p.add_argument("--src_lang", default=None, help="source language of lines without 'lang<TAB>' (e.g. fra)")
  flags.add_decoding_flags(p, "translate")
  p.add_argument("--input", default=None, help="a UTF-8 file, one sentence a line (default: standard input)")
  p.add_argument("--output", default=None, help="default: standard output")
  p.add_argument("--list_languages", action="store_true", help="print the model's source languages and exit")
  args, config = flags.parse(p, argv)
  logging.getLogger().setLevel(logging.WARNING)  # standard output is the translations; stderr only what matters
  from gshard_mt.parallel import distributed
  from gshard_mt.tools import translate

  if args.list_languages:
    print("\n".join(translate.languages_of(args.workdir)))
    return
  distributed.initialize_distributed(config)
  try:
    translate.translate(args.workdir, input_path=args.input, output_path=args.output, src_lang=args.src_lang,
                        step=args.step, average_last=args.average_last, beam_size=args.beam_size, alpha=args.alpha,
                        max_decode_len=args.max_decode_len, batch_size=args.batch_size)
  except BrokenPipeError:  # the reader stopped early (`| head -1`): no traceback, and none at exit either
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(1)


if __name__ == "__main__":
  cli.run(main)

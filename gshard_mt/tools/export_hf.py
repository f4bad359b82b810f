"""A run's checkpoint as a directory transformers loads with from_pretrained: M2M100 (a dense run) or NllbMoe.

  python -m gshard_mt.tools.export_hf --workdir runs/x --out DIR [--step N] [--max_shard_gb 5]
  # then, with transformers: AutoModelForSeq2SeqLM.from_pretrained(DIR), AutoTokenizer.from_pretrained(DIR)

Writes config.json, generation_config.json, model.safetensors (or shards and their index) and, for a run with the
NLLB tokenizer, its files. What those classes cannot express (another router, shared experts, learned positions,
another layer norm epsilon, ...) is refused in one line naming the option, before anything is written. A model
without biases is written with zero biases, which computes the same. Not exact once capacity binds: NllbMoe
routes over the whole batch, this model in groups of moe.group_size tokens.
"""

from __future__ import annotations

import json

from gshard_mt import cli, io
from gshard_mt.data import tokenizer_files
from gshard_mt.data.nllb import NllbTokenizer
from gshard_mt.errors import WorkdirError
from gshard_mt.evaluation import evaluate
from gshard_mt.hf import configs, convert, safetensors


def main(argv):
  parser = cli.parser(__doc__)
  parser.add_argument("--workdir", required=True, help="a run with a checkpoint")
  parser.add_argument("--out", required=True, help="the directory to write (new, or empty)")
  parser.add_argument("--step", type=int, default=None, help="the checkpoint (default: the newest)")
  parser.add_argument("--max_shard_gb", type=float, default=5.0, help="larger checkpoints are written in shards")
  args = parser.parse_args(argv)
  out = io.path(args.out)
  config, tokenizer, setup = convert.run_setup(args.workdir)
  if out.exists() and any(out.iterdir()):
    raise WorkdirError(f"--out {out}: not empty; export into a new directory")
  ids = tokenizer.ids
  bos = 0 if isinstance(tokenizer, NllbTokenizer) else ids.start  # NLLB's <s>; ours has none
  hf = configs.hf_config(config, setup.model_cfg.model.vocab_size, ids, bos, 2 * config.data.max_length)
  step, state = evaluate.restore_state(io.path(args.workdir), setup.abstract_target(), args.step)  # refusals first
  out.mkdir(parents=True, exist_ok=True)
  files = safetensors.write(out, convert.export_tensors(setup.model_cfg, state.params), {"format": "pt"},
                            max_shard_bytes=int(args.max_shard_gb * 2**30))
  io.write_atomically(out / "config.json", json.dumps(hf | {"transformers_version": "4.57.1"}, indent=2))
  generation = {"bos_token_id": bos, "eos_token_id": ids.eos, "pad_token_id": ids.pad,
                "decoder_start_token_id": ids.start, "max_length": 200}
  io.write_atomically(out / "generation_config.json", json.dumps(generation, indent=2))
  if isinstance(tokenizer, NllbTokenizer):
    tokenizer_files.copy_into(tokenizer.path, out)
    note = "with its NLLB tokenizer"
  else:
    note = "without a tokenizer (transformers has no class for this run's own SentencePiece vocabulary)"
  print(f"wrote {out}: {hf['architectures'][0]} from {args.workdir} step {step}, {len(files)} safetensors "
        f"file(s), {note}")


if __name__ == "__main__":
  cli.run(main)

"""transformers' half of bench/hf_decode.py (which runs it and says why): builds a random-weight M2M100 or NllbMoe
model with the fixtures' NLLB-style tokenizer, save_pretrained's it, tokenizes the bench's sentences and times
`generate` (greedy and beam) on them. Imports torch and transformers, never gshard_mt. The environment:

  python3.11 -m venv /work/hfenv && /work/hfenv/bin/pip install torch==2.13.0 transformers==4.57.1 sentencepiece \
    protobuf                                      # the CPU torch wheel
  /work/hfenv/bin/python bench/hf_decode_hf.py --model 600m --out DIR --repeats 3

DIR gets the checkpoint (what import_hf reads) and hf.npz (input_ids, attention_mask, greedy, beam) with hf.json
(versions, sizes, the generate arguments, each run's seconds).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import sys
import tempfile
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools"))
import hf_fixtures  # noqa: E402  (tools/ is no package)
import hf_reference as ref  # noqa: E402

WIDE = dict(d_model=1024, encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
            decoder_ffn_dim=4096)
# NLLB-200-distilled-600M's shape; the MoE: NLLB-MoE's layout (every 4th layer sparse) at the same width.
MODELS = {"600m": ("m2m100", dict(WIDE, encoder_layers=12, decoder_layers=12)),
          "moe": ("nllb_moe", dict(WIDE, encoder_layers=12, decoder_layers=12, num_experts=8, encoder_sparse_step=4,
                                   decoder_sparse_step=4, moe_token_dropout=0.2))}
VOCAB = 256206  # NLLB-200's; the small tokenizer's ids are all below it
SRC_LANG = "fra_Latn"
WARMUP_TOKENS = 4  # torch compiles nothing: a short warm-up allocates and picks its kernels as a long run does
EARLY_STOPPING = False  # generate()'s default, which NLLB-200's generation_config.json leaves as it is


def sentences(tokenizer, count: int, shortest: int, longest: int) -> list[list[int]]:
  """`count` source rows of shortest..longest tokens (language code and </s> included), spread over that range:
  word runs of ref.TEXT, in order."""
  words = ref.TEXT.split()
  tokenizer.src_lang = SRC_LANG
  rows, start = [], 0
  for i in range(count):
    target = shortest + (longest - 6 - shortest) * i // max(count - 1, 1)  # a word adds up to ~6 tokens
    end = start + 1
    while len(tokenizer(" ".join(words[start:end]))["input_ids"]) < target:
      end += 1
    ids = tokenizer(" ".join(words[start:end]))["input_ids"]
    assert shortest <= len(ids) <= longest, (len(ids), target)
    rows.append(ids)
    start = end % (len(words) - 60)
  return rows


def generate(model, batch: dict, beams: int, forced: int, max_new: int) -> tuple[np.ndarray, float]:
  start = time.perf_counter()
  with torch.no_grad():
    out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=beams,
                         do_sample=False, forced_bos_token_id=forced, max_new_tokens=max_new,
                         early_stopping=EARLY_STOPPING)
  return out.numpy(), time.perf_counter() - start


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", choices=sorted(MODELS), required=True)
  parser.add_argument("--out", type=pathlib.Path, required=True)
  parser.add_argument("--layers", type=int, default=12, help="encoder and decoder layers each")
  parser.add_argument("--sentences", type=int, default=16)
  parser.add_argument("--max_new_tokens", type=int, default=32)
  parser.add_argument("--beams", default="1,4", type=lambda s: [int(b) for b in s.split(",")])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--seed", type=int, default=1)
  args = parser.parse_args(argv)
  args.out.mkdir(parents=True, exist_ok=True)
  kind, sizes = MODELS[args.model]
  sizes = dict(sizes, encoder_layers=args.layers, decoder_layers=args.layers)
  built = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    tokenizer = ref.nllb_tokenizer(ref.train_spm(pathlib.Path(tmp) / "sentencepiece.bpe.model", 420))
  model = ref.build_model(kind, VOCAB, sizes, args.seed)
  hf_fixtures.save(model, tokenizer, args.out, None)
  built = time.perf_counter() - built
  ids, mask = ref.padded(sentences(tokenizer, args.sentences, 10, 30), tokenizer.pad_token_id)
  batch = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
  forced = tokenizer.convert_tokens_to_ids(ref.TGT_LANG)
  outputs, runs = {}, {}
  for beams in args.beams:
    warm = generate(model, batch, beams, forced, min(WARMUP_TOKENS, args.max_new_tokens))[1]
    timed = [generate(model, batch, beams, forced, args.max_new_tokens) for _ in range(args.repeats)]
    outputs[beams] = timed[0][0]
    runs[beams] = dict(warmup_seconds=warm, warmup_tokens=min(WARMUP_TOKENS, args.max_new_tokens),
                       seconds=[t[1] for t in timed])
    print(f"transformers beam {beams}: warm-up {warm:.2f} s, runs {[round(s, 2) for s in runs[beams]['seconds']]}",
          flush=True)
  np.savez(args.out / "hf.npz", input_ids=ids, attention_mask=mask,
           **{f"beam{b}": out for b, out in outputs.items()})
  meta = dict(kind=kind, sizes=sizes, vocab_size=VOCAB, parameters=sum(p.numel() for p in model.parameters()),
              transformers=transformers.__version__, torch=torch.__version__, torch_threads=torch.get_num_threads(),
              python=platform.python_version(), build_and_save_seconds=built, src_lang=SRC_LANG,
              tgt_lang=ref.TGT_LANG, forced_bos_token_id=forced, early_stopping=EARLY_STOPPING,
              length_penalty=model.generation_config.length_penalty, max_new_tokens=args.max_new_tokens,
              attn_implementation=model.config._attn_implementation, runs=runs,
              source_lengths=mask.sum(1).tolist())
  (args.out / "hf.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
  main(sys.argv[1:])

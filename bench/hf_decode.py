"""Decoding speed of an imported NLLB model, ours against transformers' `generate`, on this CPU: the same source
sentences (batch 16), greedy and beam 4, float32, random weights.

  python bench/hf_decode.py --model 600m [--repeats 3] [--hf_python /work/hfenv/bin/python]
  python bench/hf_decode.py --model moe [--layers 12]

Two processes, one after the other (each model copy is GBs): bench/hf_decode_hf.py in the transformers environment
(its docstring says how to make it) builds the model (600m: NLLB-200-distilled-600M's shape; moe: NLLB-MoE's
layout, every 4th layer sparse, 8 experts, at the same width), save_pretrained's it, tokenizes, times generate()
and saves the ids and outputs; then `python -m gshard_mt.tools.import_hf` makes a work directory from the
checkpoint and this process decodes the same ids with decode.Translator. Each side: one warm-up run (theirs: 4
new tokens; ours: the whole call, compiling, reported as the first call's seconds less the median run), then
--repeats timed runs, median reported.
Greedy outputs must be the same token ids; beam outputs may differ (our length penalty is GNMT's alpha=0.6,
transformers' length_penalty=1.0 with early_stopping False), and the rows that agree are counted. Prints a table
and writes bench/results/hf_decode/<date>-<device>-<model>.json (or --out): date, device, versions, commands, every
run, the medians.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from gshard_mt.data import tokenizer_files
from gshard_mt.evaluation import evaluate
from gshard_mt.model import decode
from gshard_mt.training import validate
from gshard_mt.training.setup import build

ROOT = pathlib.Path(__file__).resolve().parents[1]
ALPHA = 0.6  # our beam search's length penalty (decode.Translator's default)


def restored(workdir: pathlib.Path):
  """(tokenizer, model config, float32 parameters) of an imported work directory, as tests/unit/test_hf_import.py."""
  config = validate.load_saved(workdir)
  tokenizer = tokenizer_files.load(config.data.tokenizer)
  setup = build(config, tokenizer)
  return tokenizer, setup.model_cfg, evaluate.restore_state(workdir, setup.abstract_target(), None)[1].params


def source_batch(ids: np.ndarray, mask: np.ndarray) -> dict:
  """transformers' right-padded input_ids/attention_mask [B, Ls] in our form: segment 1 on real tokens, positions
  from 0."""
  m = mask.astype(np.int32)
  return {"inputs": ids.astype(np.int32) * m, "inputs_segmentation": m, "inputs_position": (np.cumsum(m, 1) - 1) * m}


def ours(workdir: pathlib.Path, hf: dict, args) -> dict:
  """{beam: first call's seconds, each timed run's, the outputs [B, max_new_tokens]}."""
  tokenizer, model_cfg, params = restored(workdir)
  batch = source_batch(hf["input_ids"], hf["attention_mask"])
  out = {}
  for beam in args.beams:
    translator = decode.Translator(model_cfg, params, beam_size=beam, alpha=ALPHA, max_len=args.max_new_tokens,
                                   ids=tokenizer.ids, forced=tokenizer.forced("eng_Latn"))
    start = time.perf_counter()
    tokens = translator(batch)
    first = time.perf_counter() - start
    seconds = []
    for _ in range(args.repeats):
      start = time.perf_counter()
      translator(batch)
      seconds.append(time.perf_counter() - start)
    out[beam] = dict(first_call_seconds=first, seconds=seconds, tokens=tokens)
    print(f"ours beam {beam}: first call {first:.2f} s, runs {[round(s, 2) for s in seconds]}", flush=True)
  return out


def theirs_as_ours(rows: np.ndarray, width: int) -> np.ndarray:
  """generate()'s rows (start token 2, then the outputs, finished rows padded with 1) as ours: [B, width]."""
  rows = rows[:, 1:]
  return np.pad(rows, ((0, 0), (0, width - rows.shape[1])), constant_values=1)


def summary(args, hf_meta: dict, hf: dict, mine: dict) -> dict:
  n = len(hf["input_ids"])
  beams = {}
  for beam in args.beams:
    want = theirs_as_ours(hf[f"beam{beam}"], args.max_new_tokens)
    got = mine[beam]["tokens"]
    theirs_s = statistics.median(hf_meta["runs"][str(beam)]["seconds"])
    ours_s = statistics.median(mine[beam]["seconds"])
    beams[beam] = dict(ours_seconds=ours_s, theirs_seconds=theirs_s, ours_sentences_per_s=n / ours_s,
                       theirs_sentences_per_s=n / theirs_s, ratio_ours_over_theirs=theirs_s / ours_s,
                       compile_seconds=mine[beam]["first_call_seconds"] - ours_s,
                       ours_first_call_seconds=mine[beam]["first_call_seconds"], ours_runs=mine[beam]["seconds"],
                       theirs_warmup_seconds=hf_meta["runs"][str(beam)]["warmup_seconds"],
                       theirs_runs=hf_meta["runs"][str(beam)]["seconds"],
                       identical_rows=int((got == want).all(1).sum()), rows=n,
                       identical=bool((got == want).all()), ours_tokens=got.tolist(), theirs_tokens=want.tolist())
  return beams


def report(args, result: dict):
  print(f"\n{args.model}: {result['hf']['parameters'] / 1e6:.0f}M parameters, {result['hf']['sizes']}; "
        f"{result['sentences']} sentences, max_new_tokens {args.max_new_tokens}, median of {args.repeats}; "
        f"{result['device']}, {os.cpu_count()} cores\n")
  print("| beam | ours sent/s | transformers sent/s | ours/theirs | our compile s | identical rows |\n"
        "|---|---|---|---|---|---|")
  for beam, row in result["beams"].items():
    print(f"| {beam} | {row['ours_sentences_per_s']:.2f} | {row['theirs_sentences_per_s']:.2f} | "
          f"{row['ratio_ours_over_theirs']:.2f}x | {row['compile_seconds']:.1f} | "
          f"{row['identical_rows']} of {row['rows']} |")


def main(argv: list[str]):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", choices=("600m", "moe"), required=True)
  parser.add_argument("--layers", type=int, default=12, help="encoder and decoder layers each")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--max_new_tokens", type=int, default=32)
  parser.add_argument("--beams", default="1,4", type=lambda s: [int(b) for b in s.split(",")])
  parser.add_argument("--hf_python", default="/work/hfenv/bin/python", help="the transformers environment's python")
  parser.add_argument("--out", help="the result file (default bench/results/hf_decode/<date>-<device>-<model>.json)")
  args = parser.parse_args(argv)
  if not pathlib.Path(args.hf_python).exists():
    sys.exit(f"bench/hf_decode.py: error: --hf_python {args.hf_python}: no such file (see bench/hf_decode_hf.py)")
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    hf_command = [args.hf_python, str(ROOT / "bench" / "hf_decode_hf.py"), "--model", args.model, "--out",
                  str(tmp / "hf"), "--layers", str(args.layers), "--repeats", str(args.repeats), "--max_new_tokens",
                  str(args.max_new_tokens), "--beams", ",".join(map(str, args.beams))]
    subprocess.run(hf_command, check=True, env=os.environ | {"PYTHONPATH": ""})
    hf_meta = json.loads((tmp / "hf" / "hf.json").read_text())
    hf = dict(np.load(tmp / "hf" / "hf.npz"))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gshard_mt.tools.import_hf", "--from", str(tmp / "hf"), "--workdir",
                    str(tmp / "run")], check=True, cwd=ROOT)
    import_seconds = time.perf_counter() - start
    (tmp / "hf" / "model.safetensors").unlink()  # its memory map and disk, before ours loads
    mine = ours(tmp / "run", hf, args)
  device = jax.devices()[0]
  result = {"date": datetime.date.today().isoformat(), "device": device.device_kind, "platform": device.platform,
            "cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "jax": jax.__version__, "python": platform.python_version(),
            "command": "python bench/hf_decode.py " + " ".join(argv), "hf_command": " ".join(hf_command[1:]),
            "sentences": len(hf["input_ids"]), "source_lengths": hf_meta["source_lengths"],
            "import_seconds": import_seconds, "alpha": ALPHA, "hf": hf_meta,
            "beams": summary(args, hf_meta, hf, mine)}
  report(args, result)
  name = f"{result['date']}-{device.platform}-{args.model}{'' if args.layers == 12 else f'-{args.layers}layers'}"
  out = pathlib.Path(args.out or ROOT / "bench" / "results" / "hf_decode" / f"{name}.json")
  out.parent.mkdir(parents=True, exist_ok=True)
  out.with_suffix(".tmp").write_text(json.dumps(result, indent=1) + "\n")
  out.with_suffix(".tmp").rename(out)
  print(f"\nwrote {out}")


if __name__ == "__main__":
  main(sys.argv[1:])

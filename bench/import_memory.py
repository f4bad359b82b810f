"""Peak host memory of `tools.import_hf` on a synthetic M2M100 checkpoint of about 1 GB, against its size.

  python bench/import_memory.py [--layers 6] [--optimizer adafactor]

Writes a random float32 M2M100 checkpoint (d_model 1024, FFN 4096, 16 heads, --layers + --layers layers, a 64,000
vocabulary; the fixtures' NLLB tokenizer) with gshard_mt.hf.safetensors, imports it in a child process and reads
the child's peak resident memory (getrusage). On a CPU the devices' memory is the host's: the parameters once, the
optimizer's state (Adafactor's is small; Adam's two moments are two more copies) and the interpreter's own.
Writes bench/results/import_memory/<date>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from gshard_mt.hf import names, safetensors

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "hf" / "m2m100"


def synthetic(directory: pathlib.Path, layers: int, vocab: int = 64_000, d: int = 1024, f: int = 4096) -> int:
  """Writes the checkpoint and its config.json; returns the tensors' bytes."""
  hf = json.loads((FIXTURE / "config.json").read_text()) | {
      "d_model": d, "encoder_ffn_dim": f, "decoder_ffn_dim": f, "encoder_attention_heads": 16,
      "decoder_attention_heads": 16, "encoder_layers": layers, "decoder_layers": layers, "vocab_size": vocab}
  rng = np.random.default_rng(0)
  shapes = {"model.shared.weight": (vocab, d)}
  for stack in names.STACKS:
    for i in range(layers):
      for hf_name, _, transform in names.layer_rules(names.M2M100, stack == "decoder", False):
        shape = {"qkv": (d, d), "out": (d, d), "flat": (d,)}.get(transform)
        if shape is None:
          shape = ((f, d) if "fc1" in hf_name else (d, f)) if transform == "linear" else (
              (f,) if hf_name.startswith("fc1") else (d,))
        shapes[f"model.{stack}.layers.{i}.{hf_name}"] = shape
    shapes |= {f"model.{stack}.layer_norm.weight": (d,), f"model.{stack}.layer_norm.bias": (d,)}
  tensors = ((n, (0.02 * rng.standard_normal(s, np.float32))) for n, s in shapes.items())
  safetensors.write(directory, tensors, {"format": "pt"})
  (directory / "config.json").write_text(json.dumps(hf))
  for name in ("sentencepiece.bpe.model", "tokenizer_config.json", "special_tokens_map.json"):
    shutil.copyfile(FIXTURE / name, directory / name)
  return sum(4 * int(np.prod(s)) for s in shapes.values())


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--layers", type=int, default=6)
  parser.add_argument("--optimizer", default="adafactor", choices=("adafactor", "adam"))
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    size = synthetic(tmp / "hf", args.layers)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gshard_mt.tools.import_hf", "--from", str(tmp / "hf"), "--workdir",
                           str(tmp / "run"), f"--config.optimizer.name={args.optimizer}"], check=True, cwd=ROOT,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux: KiB
  result = {"date": datetime.date.today().isoformat(), "device": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "jax": jax.__version__, "command": " ".join(["python", *sys.argv]),
            "checkpoint_bytes": size, "optimizer": args.optimizer, "peak_rss_bytes": peak,
            "peak_over_checkpoint": round(peak / size, 2), "seconds": round(seconds, 1),
            "import_hf_said": done.stdout.strip().splitlines()[-1]}
  out = ROOT / "bench" / "results" / "import_memory" / f"{result['date']}-{args.optimizer}.json"
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(result, indent=2) + "\n")
  print(json.dumps(result, indent=2))


if __name__ == "__main__":
  main()

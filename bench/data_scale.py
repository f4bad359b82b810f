"""Corpora of real size: preparation time, cached start, train.py's peak memory and packed tokens/s, against pairs.

  python bench/data_scale.py [--pairs 100000 1000000 3000000 10000000] [--root /tmp/scale] [--formats]

For each size: a synthetic corpus of 73 languages (bench/synthetic_corpus.py, made once under --root), then
  prepare    `python -m gshard_mt.tools.prepare_data` with configs/tiny.py and a 32k vocabulary into
             <root>/prepared (wall time and peak RSS by /usr/bin/time; its steps' seconds from the manifest);
  start      a new process's time from `pipeline.load` of the prepared corpus to its first training batch
             (what train.py does before compiling; Python and JAX imports left out);
  train.py   `python train.py --config configs/tiny.py ... --config.num_train_steps=3` on the prepared corpus,
             wall time and peak RSS (compilation included: the same at every size);
  tokens/s   real tokens per second packed by one process from the memory-mapped corpus (tiny's 8 x 128 / 80 rows
             and base's 512 x 64 / 40; median of 3 runs of 100 batches) and the packing efficiency.
--formats compares random access to token sequences: a NumPy memory map against ArrayRecord (what TFDS and Grain
read), on the first 1M training pairs of the largest corpus. Prints JSON lines, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gshard_mt import cli  # noqa: E402
from gshard_mt.data import pipeline  # noqa: E402


def overrides(root: pathlib.Path, pairs: int) -> dict[str, str]:
  return {"data.source": "folder", "data.path": str(root / f"synth-{pairs}"), "data.vocab_size": "32000",
          "data.prepared_dir": str(root / "prepared")}


def timed(command: list[str]) -> tuple[float, float, float, str]:
  """(wall seconds, CPU seconds (user + system, its processes), peak RSS GiB, output) of a command run under
  /usr/bin/time -v."""
  proc = subprocess.run(["/usr/bin/time", "-v", *command], capture_output=True, text=True, cwd=ROOT)
  if proc.returncode:
    raise RuntimeError(f"{command} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
  rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)[1]) / 2**20
  wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (.+)", proc.stderr)[1].split(":")
  cpu = sum(float(re.search(rf"{kind} time \(seconds\): ([\d.]+)", proc.stderr)[1]) for kind in ("User", "System"))
  return sum(float(x) * 60**i for i, x in enumerate(reversed(wall))), cpu, rss, proc.stdout + proc.stderr


def start_seconds(root: pathlib.Path, pairs: int) -> float:
  """Seconds from `pipeline.load` to the first training batch, in a new process."""
  code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from gshard_mt import cli as c; "
          "from gshard_mt.data import pipeline; import json; "
          "config = c.load(sys.argv[1] + '/configs/tiny.py', json.loads(sys.argv[2])); t = time.perf_counter(); "
          "pipeline.load(config, sys.argv[3]).train_batches(config).batch(0); print(time.perf_counter() - t)")
  out = subprocess.run([sys.executable, "-c", code, str(ROOT), json.dumps(overrides(root, pairs)),
                        str(root / f"train-{pairs}")], capture_output=True, text=True, check=True)
  return float(out.stdout.split()[-1])


def packed(root: pathlib.Path, pairs: int) -> dict[str, tuple[float, float]]:
  """{rows: (real tokens/s, packing efficiency)} from the memory-mapped corpus, one process."""
  config = cli.load(ROOT / "configs" / "tiny.py", overrides(root, pairs))
  data = pipeline.load(config, root / f"train-{pairs}")
  out = {}
  for rows, lengths in ((8, (128, 80)), (512, (64, 40))):
    rates = []
    for _ in range(3):
      batches = pipeline.TrainBatches(data.tokens["train"], data.rates, rows, lengths, config.data.seed)
      batches.batch(0)
      start, tokens = time.perf_counter(), 0
      for i in range(1, 101):
        b = batches.batch(i)
        tokens += int((b["inputs_segmentation"] > 0).sum() + (b["targets_segmentation"] > 0).sum())
      rates.append(tokens / (time.perf_counter() - start))
    out[f"{rows} x {lengths[0]} / {lengths[1]}"] = (statistics.median(rates), batches.packing_efficiency)
  return out


def formats(root: pathlib.Path, pairs: int) -> dict[str, float]:
  """Milliseconds to read the source tokens of k random pairs: memory map against ArrayRecord."""
  from array_record.python import array_record_module

  config = cli.load(ROOT / "configs" / "tiny.py", overrides(root, pairs))
  split = pipeline.load(config, root / f"train-{pairs}").tokens["train"]
  n = min(len(split), 1_000_000)
  path = root / "formats.array_record"
  writer = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
  offsets, tokens = np.asarray(split.src_offsets[:n + 1]), split.src_tokens
  for i in range(n):
    writer.write(tokens[offsets[i]:offsets[i + 1]].tobytes())
  writer.close()
  reader = array_record_module.ArrayRecordReader(str(path), "readahead_buffer_size:0")
  rng, out = np.random.default_rng(0), {}
  for k in (300, 3000):
    ids = rng.integers(0, n, k)
    start = time.perf_counter()
    for _ in range(20):
      lo, lengths = offsets[ids], offsets[ids + 1] - offsets[ids]
      gathered = tokens[np.repeat(lo, lengths) + np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths,
                                                                                      lengths)]
    out[f"memmap, {k} pairs"] = (time.perf_counter() - start) / 20 * 1e3
    start = time.perf_counter()
    for _ in range(20):
      records = np.concatenate([np.frombuffer(r, tokens.dtype) for r in reader.read(ids.tolist())])
    out[f"array_record, {k} pairs"] = (time.perf_counter() - start) / 20 * 1e3
    assert (records == gathered).all()
  path.unlink()
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--pairs", type=int, nargs="+", default=[100_000, 1_000_000, 3_000_000, 10_000_000])
  parser.add_argument("--root", default="/tmp/scale")
  parser.add_argument("--formats", action="store_true")
  args = parser.parse_args()
  root = pathlib.Path(args.root)
  rows = []
  for pairs in args.pairs:
    if not (root / f"synth-{pairs}").is_dir():
      subprocess.run([sys.executable, str(ROOT / "bench" / "synthetic_corpus.py"), "--pairs", str(pairs), "--out",
                      str(root / f"synth-{pairs}")], check=True)
    flags = [f"--config.{k}={v}" for k, v in overrides(root, pairs).items()]
    tiny = ["--config", str(ROOT / "configs" / "tiny.py")]
    prep_s, prep_cpu, prep_rss, out = timed([sys.executable, "-m", "gshard_mt.tools.prepare_data", *tiny, "--workdir",
                                   str(root / f"train-{pairs}"), *flags])
    directory = re.search(r"^(\S+): \d+ streams", out, re.M)[1]  # prepare_data's line
    manifest = json.loads((pathlib.Path(directory) / "manifest.json").read_text())
    start = start_seconds(root, pairs)
    train_s, _, train_rss, _ = timed([sys.executable, "train.py", *tiny, "--workdir", str(root / f"train-{pairs}"),
                                   *flags, "--config.num_train_steps=3"])
    row = {"pairs": pairs, "prepare_s": round(prep_s, 1), "prepare_cpu_s": round(prep_cpu),
           "prepare_rss_gib": round(prep_rss, 2), "prepare_steps_s": manifest["info"]["seconds"],
           "start_s": round(start, 2),
           "train_s": round(train_s, 1), "train_rss_gib": round(train_rss, 2),
           "packed": {k: (round(v), round(e, 3)) for k, (v, e) in packed(root, pairs).items()},
           "load_average": os.getloadavg()[0]}
    if args.formats and pairs == max(args.pairs):
      row["formats_ms"] = {k: round(v, 2) for k, v in formats(root, pairs).items()}
    print(json.dumps(row), flush=True)
    rows.append(row)
  print("\n| pairs | prepare: wall (read, tokenizer, tokenize), CPU | prepare peak RSS | start to first batch | "
        "train.py, 3 steps | train.py peak RSS | packed tokens/s (efficiency) 8 x 128 / 80; 512 x 64 / 40 |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    steps = ", ".join(f"{v:.0f}" for v in r["prepare_steps_s"].values())
    tokens = "; ".join(f"{v:,} ({e})" for v, e in r["packed"].values())
    print(f"| {r['pairs']:,} | {r['prepare_s']:.0f} s ({steps}), {r['prepare_cpu_s']} s | {r['prepare_rss_gib']} GiB | "
          f"{r['start_s']} s | "
          f"{r['train_s']:.0f} s | {r['train_rss_gib']} GiB | {tokens} |")


if __name__ == "__main__":
  main()

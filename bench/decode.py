"""Decoding speed of a trained work directory: sentences/s and tokens/s of greedy and beam search, optionally
against another version of the code on the same checkpoint, with a check that both find the same hypotheses.

  python bench/decode.py --workdir runs/tiny [--split test] [--sentences 2000] [--beams 1,4] [--repeats 3]
  python bench/decode.py --workdir runs/tiny --sentences 0 --beams 4 --against HEAD~1   # before / after

Decodes the same sentences of the split (the first --sentences of a fixed shuffle, all languages; 0 = all) as
eval.py does (similar lengths batched together, `batch_size` sentences per batch, compiled before the clock
starts). Each repeat runs in a fresh process per code version; with --against (a git revision of this
repository, or a directory holding a gshard_mt package) the two versions alternate (ABBA), so that a shared
machine's load falls on both alike. Reports the median wall and CPU seconds, and the ratio of the other
version's median to this one's (> 1: this version is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def measure(args) -> dict:
  """Runs in a worker process whose sys.path starts with the code under test: {beam: speed and hypotheses}."""
  import numpy as np

  from gshard_mt.data import pipeline
  from gshard_mt.evaluation import evaluate
  from gshard_mt.model import decode

  run = evaluate.restore(args.workdir, split=args.split)
  n = len(run.data.tokens[args.split])
  ids = np.random.default_rng(0).permutation(n)[: args.sentences or n]
  rows = args.batch_size or run.config.batch_size
  out = {}
  for beam in args.beams:
    translator = decode.Translator(run.model_cfg, run.params, beam, args.alpha, run.config.data.max_length)
    translator(next(pipeline.eval_batches(run.data.tokens[args.split], rows, run.config.data.max_length,
                                          ids)))  # compiles, outside the CPU time
    cpu = time.process_time()
    hyps, speed = evaluate.decode_pairs(translator, run, split=args.split, ids=ids, rows=rows, progress=False)
    out[beam] = speed | {"cpu_seconds": time.process_time() - cpu, "step": run.step,
                         "hyps": [hyps[int(i)] for i in sorted(ids)]}
  return out


def worker_command(source: pathlib.Path, args, out: pathlib.Path) -> list[str]:
  return [sys.executable, __file__, "--worker", str(source), "--out", str(out), "--workdir", args.workdir,
          "--split", args.split, "--sentences", str(args.sentences), "--beams", ",".join(map(str, args.beams)),
          "--alpha", str(args.alpha), "--batch_size", str(args.batch_size)]


def other_source(against: str, tmp: pathlib.Path) -> pathlib.Path:
  """A directory whose gshard_mt is the code of `against` (a directory, or a git revision exported into tmp)."""
  tmp.mkdir()
  if (pathlib.Path(against) / "gshard_mt").is_dir():
    return pathlib.Path(against).resolve()
  archive = subprocess.run(["git", "-C", str(ROOT), "archive", against, "gshard_mt"], capture_output=True)
  if archive.returncode:
    sys.exit(f"bench/decode.py: error: --against {against}: neither a directory with gshard_mt/ nor a git "
             f"revision ({archive.stderr.decode().strip()})")
  subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
  (tmp / "data").symlink_to(ROOT / "data")  # the shipped corpora, found next to the package
  return tmp


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--split", default="test", choices=("dev", "test"))
  parser.add_argument("--sentences", type=int, default=2000, help="0 = the whole split")
  parser.add_argument("--beams", default="1,4", type=lambda s: [int(b) for b in s.split(",")])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--alpha", type=float, default=0.6)
  parser.add_argument("--batch_size", type=int, default=0, help="sentences per batch (0: the config's, as eval.py)")
  parser.add_argument("--against", help="a git revision or a directory with gshard_mt/: the version to compare")
  parser.add_argument("--worker", help=argparse.SUPPRESS)  # the source directory a worker imports
  parser.add_argument("--out", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    sys.path.insert(0, args.worker)
    pathlib.Path(args.out).write_text(json.dumps(measure(args)))
    return
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    sources = {"this": ROOT} | ({"against": other_source(args.against, tmp / "src")} if args.against else {})
    runs = {side: [] for side in sources}
    for repeat in range(args.repeats):
      order = list(sources) if repeat % 2 else list(reversed(sources))  # ABBA
      for side in order:
        out = tmp / f"{side}-{repeat}.json"
        subprocess.run(worker_command(sources[side], args, out), check=True, env=os.environ | {"PYTHONPATH": ""})
        runs[side].append({int(b): r for b, r in json.loads(out.read_text()).items()})
        print(side, repeat, {b: round(r["seconds"], 2) for b, r in runs[side][-1].items()}, flush=True)
  report(args, runs)


def report(args, runs: dict):
  first = runs["this"][0][args.beams[0]]
  print(f"\n{args.workdir} step {first['step']}, {args.split} split, {first['sentences']} sentences, median of "
        f"{args.repeats} processes{f', against {args.against}' if args.against else ''}\n")
  header = "| beam | median s | CPU s | sentences/s | tokens/s |"
  if args.against:
    header += " against: median s | CPU s | sentences/s | speed-up (wall) | speed-up (CPU) | same hypotheses |"
  print(header + "\n|" + "---|" * (header.count("|") - 1))
  for beam in args.beams:
    stats = {}
    for side, reps in runs.items():
      wall = statistics.median(r[beam]["seconds"] for r in reps)
      cpu = statistics.median(r[beam]["cpu_seconds"] for r in reps)
      stats[side] = (wall, cpu, reps[0][beam]["sentences"] / wall,
                     statistics.median(r[beam]["tokens"] / r[beam]["seconds"] for r in reps))
    row = stats["this"]
    line = f"| {beam} | {row[0]:.2f} | {row[1]:.2f} | {row[2]:.1f} | {row[3]:.1f} |"
    if args.against:
      other = stats["against"]
      a, b = runs["this"][0][beam]["hyps"], runs["against"][0][beam]["hyps"]
      same = sum(x == y for x, y in zip(a, b))
      line += (f" {other[0]:.2f} | {other[1]:.2f} | {other[2]:.1f} | {other[0] / row[0]:.2f}x | "
               f"{other[1] / row[1]:.2f}x | {same} of {len(a)} |")
    print(line)


if __name__ == "__main__":
  main(sys.argv[1:])

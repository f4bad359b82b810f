"""A many-to-English folder corpus of any size with realistic vocabulary and lengths, for scale benchmarks.

  python bench/synthetic_corpus.py --pairs 1000000 --languages 73 --out /tmp/synth-1m [--seed 0]

The K languages of the shipped Tatoeba-112 with the most pairs (Multi30k's train split added to deu, fra, ces)
each get a folder pair `synth.xx-eng.xx` / `synth.xx-eng.eng` (plain text, for data.source=folder). Each line joins
1 to 3 real pairs of its language drawn at random, so sentences are real and 1-3x as long as Tatoeba's; a
language's lines are distinct (drawn again where they repeat), so the preparation keeps every pair. Languages get
pairs in proportion to 1/sqrt(rank), the largest about 8.5x the smallest at K=73 (real corpora are skewed, which
temperature sampling is for). Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gshard_mt.data import corpus  # noqa: E402


def pools(languages: int) -> dict[str, tuple[list[str], list[str]]]:
  """{lang: (sources, English)} of the `languages` largest shipped languages."""
  text, _ = corpus.load_folder(corpus.SHIPPED / "tatoeba")
  pool = {lang: (list(p.src), list(p.tgt)) for lang, p in text.items()}
  multi30k = corpus.load_multi30k()[0]["train"]
  for lang, pairs in multi30k.items():
    pool[lang][0].extend(pairs.src)
    pool[lang][1].extend(pairs.tgt)
  largest = sorted(pool, key=lambda lang: (-len(pool[lang][0]), lang))[:languages]
  return {lang: pool[lang] for lang in sorted(largest)}


def sizes(pairs: int, languages: list[str]) -> dict[str, int]:
  """Pairs per language, in proportion to 1/sqrt(rank) (languages in order of their pool size), summing to `pairs`."""
  weights = 1 / np.sqrt(np.arange(1, len(languages) + 1))
  counts = np.floor(pairs * weights / weights.sum()).astype(int)
  counts[: pairs - counts.sum()] += 1
  return dict(zip(languages, counts.tolist()))


def draw(pool: tuple[np.ndarray, np.ndarray], n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """n (source, English) lines, each joining 1-3 pairs of the pool drawn at random."""
  src, tgt = pool
  joins, picks = rng.integers(1, 4, n), rng.integers(0, len(src), (n, 3))
  lines = [src[picks[:, 0]], tgt[picks[:, 0]]]
  for j in (1, 2):
    more = joins > j
    for side, text in zip(lines, (src, tgt)):
      side[more] = side[more] + " " + text[picks[more, j]]
  return lines[0], lines[1]


def write(out: pathlib.Path, lang: str, pool: tuple[list[str], list[str]], n: int, rng: np.random.Generator):
  """n distinct lines of `lang` (drawn again until n are distinct: the preparation drops duplicate pairs)."""
  pool = (np.array(pool[0], object), np.array(pool[1], object))
  seen, lines = set(), []
  while len(lines) < n:
    for pair in zip(*draw(pool, n - len(lines) + 16, rng)):
      if pair not in seen and len(lines) < n:
        seen.add(pair)
        lines.append(pair)
  for side, name in ((0, lang), (1, "eng")):
    with open(out / f"synth.{lang}-eng.{name}", "w") as f:
      f.write("".join(pair[side] + "\n" for pair in lines))


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--pairs", type=int, required=True)
  parser.add_argument("--languages", type=int, default=73)
  parser.add_argument("--out", required=True, help="the folder to write (data.path)")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  start = time.perf_counter()
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  pool = pools(args.languages)
  by_size = sorted(pool, key=lambda lang: (-len(pool[lang][0]), lang))
  rng = np.random.default_rng(args.seed)
  for lang, n in sizes(args.pairs, by_size).items():
    write(out, lang, pool[lang], n, rng)
  size = sum(p.stat().st_size for p in out.iterdir())
  print(f"{out}: {args.pairs} pairs in {len(pool)} languages, {size / 2**30:.2f} GiB "
        f"[{time.perf_counter() - start:.0f} s]")


if __name__ == "__main__":
  main()

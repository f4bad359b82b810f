"""Language-specific pruning of a trained token-routed MoE (tools/extract --keep): each language's test BLEU with
its pruned model against the full model's, for a few --keep values.

  python bench/prune_study.py --workdir runs/multi30k [--keep 0.5,0.75,0.9] [--languages deu,fra,ces]

For each language L: `eval.py --workdir W --languages L` (the full model on L's sentences alone, batched as the
pruned model's are: a batch's sentences share the experts' capacity), then for each p: `python -m
gshard_mt.tools.extract --workdir W --languages L --keep p` (into W-L-p, the counts from `tools.expert_usage` on
--usage_split) and `eval.py --workdir W-L-p --languages L`. Writes bench/results/pruning/<W's name>.json (or --out)
with the experts kept per layer, the share of L's assignments they carry and the BLEU; bench/report.py puts it in
docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import time

import jax

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run(args: list[str]) -> float:
  """Runs a command of the project from its root; its seconds."""
  start = time.perf_counter()
  subprocess.run([sys.executable, *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
  return time.perf_counter() - start


def scores(workdir: str, lang: str) -> dict:
  """The newest test evaluation of `lang` alone in `workdir` (eval/test-<step>-<lang>/scores.json)."""
  found = sorted((ROOT / workdir / "eval").glob(f"test-*-{lang}/scores.json"), key=lambda p: p.stat().st_mtime)
  return json.loads(found[-1].read_text())["languages"][lang]


def main(argv) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--keep", default="0.5,0.75,0.9")
  parser.add_argument("--languages", default="deu,fra,ces")
  parser.add_argument("--usage_split", default="dev")
  parser.add_argument("--out", default=None)
  args = parser.parse_args(argv)
  workdir = args.workdir.rstrip("/")
  rows, seconds = [], {}
  for lang in args.languages.split(","):
    seconds[f"eval full {lang}"] = run(["eval.py", "--workdir", workdir, "--split", "test", "--languages", lang])
    full = scores(workdir, lang)
    for keep in map(float, args.keep.split(",")):
      pruned = f"{workdir}-{lang}-{keep:g}"
      seconds[f"extract {lang} {keep:g}"] = run(["-m", "gshard_mt.tools.extract", "--workdir", workdir, "--languages",
                                                 lang, "--keep", str(keep), "--usage_split", args.usage_split])
      seconds[f"eval {lang} {keep:g}"] = run(["eval.py", "--workdir", pruned, "--split", "test", "--languages", lang])
      info = json.loads((ROOT / pruned / "extracted.json").read_text())
      rows.append({"language": lang, "keep": keep, "num_experts": info["num_experts"], "kept": info["kept"],
                   "carried": info["carried"], "bleu": scores(pruned, lang)["bleu"], "full_bleu": full["bleu"],
                   "chrf": scores(pruned, lang)["chrf"], "full_chrf": full["chrf"]})
  config = json.loads((ROOT / workdir / "config.json").read_text())
  result = {"date": datetime.date.today().isoformat(), "device": f"{jax.devices()[0].device_kind} "
            f"({os.cpu_count()} cores, shared)", "jax": jax.__version__,
            "command": "python bench/prune_study.py " + " ".join(argv), "pruning": {
                "workdir": workdir, "router": config["moe"]["router"], "num_experts": config["moe"]["num_experts"],
                "num_train_steps": config["num_train_steps"], "usage_split": args.usage_split, "rows": rows,
                "seconds": {k: round(v, 1) for k, v in seconds.items()}}}
  out = pathlib.Path(args.out or ROOT / "bench" / "results" / "pruning" / f"{pathlib.Path(workdir).name}.json")
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(result, indent=2) + "\n")
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

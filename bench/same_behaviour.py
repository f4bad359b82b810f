"""Whether a change kept the behaviour of an older commit: configs/tiny.py's first logged losses, a work directory
the older code wrote (resumed and evaluated by this one), and the bad-input errors (one line, the same exit code).

  python bench/same_behaviour.py --base 76fc623 [--steps 20]

Both trees run with this interpreter (the older one from `git archive`, in a temporary folder). Writes
bench/results/same_behaviour/<base>.json and prints each check; exits 1 when one fails.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from gshard_mt import io  # noqa: E402

OUT = ROOT / "bench" / "results" / "same_behaviour"
# Bad input of every kind train.py meets before any data is read: a value, a name, a key, a combination, a file.
BAD = {
    "a bad value": ["--config.moe.num_experts=0"],
    "a misspelt name": ["--config.moe.router=gshrad"],
    "an unknown key": ["--config.moe.num_expert=4"],
    "a combination": ["--config.moe.num_selected=8"],
    "a wrong type": ["--config.model.emb_dim=wide"],
    "a section set whole": ["--config.moe=4"],
}


def run(tree: pathlib.Path, args: list[str], **kwargs) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": str(tree), "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, **kwargs)


def losses(workdir: pathlib.Path) -> list[float]:
  return [row["loss"] for row in io.read_jsonl(workdir / "metrics.jsonl") if "loss" in row]


def train(tree, workdir, steps, *extra) -> subprocess.CompletedProcess:
  short = [f"--config.num_train_steps={steps}", "--config.log_every=1", f"--config.eval_every={steps}",
           "--config.eval_bleu_every=0", f"--config.checkpoint_every={steps}"]
  return run(tree, ["train.py", "--config", "configs/tiny.py", "--workdir", str(workdir), *short, *extra],
             check=True)


def errors(tree: pathlib.Path, scratch: pathlib.Path) -> dict:
  """{case: (exit code, lines on stderr, the last line)} of train.py given each bad input."""
  out = {}
  for case, args in BAD.items():
    p = run(tree, ["train.py", "--config", "configs/tiny.py", "--workdir", str(scratch / "never"), *args])
    lines = p.stderr.strip().splitlines()
    out[case] = (p.returncode, len(lines), lines[-1] if lines else "")
  p = run(tree, ["train.py", "--config", "configs/none.py", "--workdir", str(scratch / "never")])
  out["a missing config file"] = (p.returncode, len(p.stderr.strip().splitlines()), p.stderr.strip())
  return out


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--base", required=True, help="the older commit")
  parser.add_argument("--steps", type=int, default=20)
  args = parser.parse_args(argv)
  head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                        check=True).stdout.strip()
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    base = tmp / "base"
    base.mkdir()
    archive = subprocess.run(["git", "archive", args.base], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
    train(base, tmp / "old", args.steps)
    train(ROOT, tmp / "new", args.steps)
    old, new = losses(tmp / "old"), losses(tmp / "new")
    # the older run's work directory, trained on by this code and evaluated
    train(ROOT, tmp / "old", 2 * args.steps)
    resumed = losses(tmp / "old")
    ev = run(ROOT, ["eval.py", "--workdir", str(tmp / "old"), "--split", "dev", "--languages", "fra,deu",
                    "--max_decode_len", "16"])
    bad_old, bad_new = errors(base, tmp), errors(ROOT, tmp)
  checks = {
      "losses bit-identical": old == new and len(new) == args.steps,
      "older work directory resumed": len(resumed) == 2 * args.steps and resumed[:args.steps] == old,
      "older work directory evaluated": ev.returncode == 0,
      "errors: same exit codes, one line": all(
          bad_old[c][0] == bad_new[c][0] == 2 and bad_new[c][1] == 1 for c in bad_new),
  }
  result = {"date": datetime.date.today().isoformat(), "device": platform.machine(), "cores": os.cpu_count(),
            "jax": importlib.metadata.version("jax"), "base": args.base, "head": head,
            "command": f"python bench/same_behaviour.py --base {args.base} --steps {args.steps}",
            "checks": checks, "losses_base": old, "losses_head": new,
            "eval_tail": (ev.stdout if ev.returncode == 0 else ev.stderr).strip().splitlines()[-3:],
            "errors": {c: {"base": bad_old[c], "head": bad_new[c]} for c in bad_new}}
  OUT.mkdir(parents=True, exist_ok=True)
  path = OUT / f"{args.base}.json"
  io.write_atomically(path, json.dumps(result, indent=2) + "\n")
  for case, pair in result["errors"].items():
    print(f"{case}: base exit {pair['base'][0]}: {pair['base'][2]}\n{' ' * len(case)}  head exit {pair['head'][0]}: "
          f"{pair['head'][2]}")
  for name, ok in checks.items():
    print(f"{'ok  ' if ok else 'FAIL'} {name}")
  print(f"wrote {path.relative_to(ROOT)}")
  sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
  main(sys.argv[1:])

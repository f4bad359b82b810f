"""Mutation testing of the pure core (`make mutate`): mutmut over each module against only its own unit tests.

mutmut reads one project-wide configuration and runs every mutant against the tests that reach the mutated function.
Running one module at a time against its own test file (plus its part of tests/unit/test_mutants.py) keeps a run to
minutes instead of hours: each module gets a scratch copy of the project under mutants/<name>/ with a setup.cfg
[mutmut] section of its own, and `mutmut run --max-children 1` runs there.

Every mutant runs in a process forked from mutmut's fork server (process_isolation = forkserver), which has imported
the tests but run none: a mutant inside a jitted function is traced afresh, never answered from a jit cache filled by
the unmutated code (mutmut's default forks from the process that ran the clean tests, whose jit caches could hide
such a mutant). The persistent compilation cache that tests/conftest.py sets up is shared by the mutants, so a
mutant that compiles to the unmutated program can reuse its compiled code.

  python bench/mutate.py                   # every module
  python bench/mutate.py gating dispatch   # some
  python bench/mutate.py --recheck gating  # only the mutants the last run left alive (after adding tests)
  python bench/mutate.py --list

Per module it prints generated / killed / survived / timed out / no tests, writes the diff of every surviving mutant to
mutants/<name>/survivors.diff and the counts to mutants/summary.json. docs/decisions.md records the last run's verdict
on each survivor.
"""

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
EXTRA = "tests/unit/test_mutants.py"

# name: (module, its unit tests, the mutants to run as fnmatch patterns over mutmut's names, or None for all)
MODULES = {
  "gating": ("gshard_mt/moe/gating.py", ["tests/unit/test_gating.py", f"{EXTRA}::TestGating"], None),
  "dispatch": ("gshard_mt/moe/dispatch.py", ["tests/unit/test_dispatch.py", f"{EXTRA}::TestDispatch"], None),
  "packing": ("gshard_mt/data/packing.py", ["tests/unit/test_packing.py", f"{EXTRA}::TestPacking"], None),
  "sampling": ("gshard_mt/data/sampling.py", ["tests/unit/test_sampling.py", f"{EXTRA}::TestSampling"], None),
  # decode.py's search: Translator and unscanned wire a model's parameters to it (each of their mutants would compile
  # a Transformer for every test); the search, its length penalty, beam bookkeeping and EOS cut are mutated.
  "decode": (
    "gshard_mt/model/decode.py",
    ["tests/unit/test_decode.py", f"{EXTRA}::TestDecode"],
    [f"gshard_mt.model.decode.x_{f}__mutmut_*"
     for f in ("length_penalty", "greedy_search", "beam_bias", "best_candidates", "take_rows", "beam_search",
               "cut_at_eos")],
  ),
  # evaluate.py also restores checkpoints and drives decoding; only its pure helpers (checkpoint averaging, scores,
  # the paired bootstrap, ΔBLEU, resource buckets) are mutated.
  "evaluate": (
    "gshard_mt/evaluation/evaluate.py",
    ["tests/unit/test_evaluate.py", f"{EXTRA}::TestEvaluate"],
    [f"gshard_mt.evaluation.evaluate.x_{f}__mutmut_*"
     for f in ("average_params", "score", "versus_baseline", "resource_buckets")],
  ),
  "report": ("gshard_mt/evaluation/report.py", ["tests/unit/test_report.py", f"{EXTRA}::TestReport"], None),
}

# What the tests read besides the code: the small config and the shipped data its tokenizer is trained on.
ALSO_COPY = ("configs", "data")
STATUS = re.compile(r"^\s*(\S+): (.+)$")


def setup_cfg(module: str, tests: list[str]) -> str:
  lines = lambda xs: "".join(f"\n  {x}" for x in xs)
  return (
    "[mutmut]\n"
    "source_paths =\n  gshard_mt\n"
    f"only_mutate ={lines([module])}\n"
    f"pytest_add_cli_args_test_selection ={lines(tests)}\n"
    f"pytest_add_cli_args ={lines(['-p', 'no:cacheprovider'])}\n"
    f"also_copy ={lines(ALSO_COPY)}\n"
    "process_isolation = forkserver\n"
    "use_git_change_detection = false\n"
  )


def _exists(test: str) -> bool:
  """A test file, or a file::Class whose class is there (test_mutants.py holds a class only where it kills some)."""
  path, _, cls = test.partition("::")
  return (ROOT / path).exists() and (not cls or f"class {cls}" in (ROOT / path).read_text())


def run_module(name: str, python: str, previous: dict | None = None, only: list[str] | None = None) -> dict:
  """Runs mutmut over one module; with `previous` (this module's last result), only the mutants it left alive
  (and of those, with `only`, the ones matching one of these fnmatch patterns)."""
  module, tests, patterns = MODULES[name]
  source = hashlib.sha256((ROOT / module).read_bytes()).hexdigest()
  if previous is not None:
    if previous.get("source") != source:  # mutmut numbers a function's mutants in order: an edit renumbers them
      raise SystemExit(f"--recheck {name}: {module} changed since the last run; run it again in full")
    patterns = sorted(k for k, s in previous["status"].items()
                      if s != "killed" and (not only or any(fnmatch.fnmatch(k, p) for p in only)))
    if not patterns:
      return previous
  work = MUTANTS / name
  shutil.rmtree(work, ignore_errors=True)
  work.mkdir(parents=True)
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
  for d in ("gshard_mt", "tests", *ALSO_COPY):
    shutil.copytree(ROOT / d, work / d, ignore=ignore)
  shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
  (work / "setup.cfg").write_text(setup_cfg(module, [t for t in tests if _exists(t)]))
  mutmut = [python, "-m", "mutmut"]
  env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
  start = time.monotonic()
  log = (work / "run.log").open("w")
  rc = subprocess.call([*mutmut, "run", "--max-children", "1", *(patterns or [])], cwd=work, env=env, stdout=log,
                       stderr=subprocess.STDOUT)
  seconds = time.monotonic() - start
  if rc != 0:
    print(f"{name}: mutmut run exited {rc}; see {work / 'run.log'}", file=sys.stderr)
  out = subprocess.run([*mutmut, "results", "--all", "true"], cwd=work, env=env, capture_output=True, text=True).stdout
  status = {}
  for line in out.splitlines():
    m = STATUS.match(line)
    if m and (not patterns or any(fnmatch.fnmatch(m[1], p) for p in patterns)):
      status[m[1]] = m[2].strip()
  if previous is not None:
    seconds += previous["seconds"]
    status = {**previous["status"], **status}
  counts = {"generated": len(status)}
  for s in status.values():
    counts[s] = counts.get(s, 0) + 1
  survivors = sorted(k for k, s in status.items() if s != "killed")
  with (work / "survivors.diff").open("w") as f:
    for k in (k for k in survivors if status[k] != "not checked"):
      diff = subprocess.run([*mutmut, "show", k], cwd=work, env=env, capture_output=True, text=True).stdout
      f.write(f"{diff}\n")
  return {"module": module, "source": source, "seconds": round(seconds), "rc": rc, "counts": counts,
          "not_killed": {k: status[k] for k in survivors}, "status": status}


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("names", nargs="*", help=f"modules to mutate (default: all of {', '.join(MODULES)})")
  parser.add_argument("--list", action="store_true", help="list the modules and their tests")
  parser.add_argument("--recheck", action="store_true",
                      help="run only the mutants the last run (mutants/summary.json) left alive, e.g. after adding "
                      "tests; the counts (and seconds) are then the last run's with those mutants' new verdicts")
  parser.add_argument("--only", action="append", metavar="PATTERN",
                      help="with --recheck: only the surviving mutants matching this fnmatch pattern (repeatable)")
  args = parser.parse_args()
  if args.list:
    for name, (module, tests, _) in MODULES.items():
      print(f"{name:10s} {module}  <-  {' '.join(tests)}")
    return
  unknown = set(args.names) - set(MODULES)
  if unknown:
    parser.error(f"unknown modules {sorted(unknown)}; known: {list(MODULES)}")
  summary_path = MUTANTS / "summary.json"
  summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
  print(f"{'module':10s} {'generated':>9s} {'killed':>6s} {'survived':>8s} {'timeout':>7s} {'no tests':>8s} "
        f"{'other':>5s} {'seconds':>7s}")
  for name in args.names or list(MODULES):
    if args.recheck and "status" not in summary.get(name, {}):
      parser.error(f"--recheck {name}: no earlier run in {summary_path}")
    result = run_module(name, sys.executable, summary[name] if args.recheck else None, args.only)
    summary[name] = result
    # Read again before writing: another `make mutate` of other modules may have written its results meanwhile.
    latest = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    temporary = summary_path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(latest | {name: result}, indent=1) + "\n")
    os.replace(temporary, summary_path)
    c = dict(result["counts"])
    known = [c.pop(k, 0) for k in ("generated", "killed", "survived", "timeout", "no tests")]
    print(f"{name:10s} {known[0]:9d} {known[1]:6d} {known[2]:8d} {known[3]:7d} {known[4]:8d} "
          f"{sum(c.values()):5d} {result['seconds']:7d}", flush=True)
    for k, s in result["not_killed"].items():
      if s != "not checked":
        print(f"  {s:9s} {k}")


if __name__ == "__main__":
  main()

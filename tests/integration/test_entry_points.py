"""Every entry point answers bad input with one line naming the file (or directory) and exit status 2, before any
compilation: the four malformed-corpus cases and a work directory that does not match."""

import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT, fresh_env

pytestmark = pytest.mark.slow  # starts processes

SMALL = ["--config.data.vocab_size=300", "--config.num_train_steps=1", "--config.batch_size=8",
         "--config.data.max_length=24", "--config.moe.group_size=64"]


def folder_with(tmp_path, case):
  """A corpus folder with one defect; returns (folder, the file the message must name)."""
  folder = tmp_path / case
  folder.mkdir()
  src, eng = folder / "c.fra-eng.fra", folder / "c.fra-eng.eng"
  lines = [f"phrase {i}" for i in range(40)]
  src.write_text("\n".join(lines) + "\n")
  eng.write_text("\n".join(f"sentence {i}" for i in range(40)) + "\n")
  if case == "line_count":
    eng.write_text("\n".join(f"sentence {i}" for i in range(39)) + "\n")
  elif case == "utf8":
    src.write_bytes(b"ok\n" * 6 + b"bad \xff byte\n" + b"ok\n" * 33)
    return folder, f"{src}:7"
  elif case == "empty":
    src.write_text("")
    eng.write_text("")
  elif case == "no_english":
    eng.unlink()
  return folder, str(src)


INFO = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ INFO ")


def run(*args):
  return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT,
                        env=fresh_env())


def assert_one_line_error(proc, *needles):
  """Exit 2 and one line of error: the progress a command logged before it (INFO lines) aside."""
  lines = [line for line in proc.stderr.strip().splitlines() if not INFO.match(line)]
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  for needle in needles:
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("case", ["line_count", "utf8", "empty", "no_english"])
@pytest.mark.parametrize("command", [["train.py", "--workdir", "{tmp}/run"],
                                     ["-m", "gshard_mt.tools.inspect_data", "--workdir", "{tmp}/run"]],
                         ids=["train", "inspect_data"])
def test_malformed_corpus(tmp_path, case, command):
  folder, named = folder_with(tmp_path, case)
  args = [a.format(tmp=tmp_path) for a in command]
  proc = run(*args, "--config", "configs/tiny.py", "--config.data.source=folder", f"--config.data.path={folder}",
             "--config.data.languages=", *SMALL)
  assert_one_line_error(proc, named)


def test_work_directory_for_another_model(tmp_path):
  from gshard_mt import config_files
  from tests.helpers import small_config

  workdir = tmp_path / "run"
  config_files.save(small_config(), workdir)
  (workdir / "checkpoints" / "3").mkdir(parents=True)  # a run that has started: its config.json protects it
  proc = run("train.py", "--config", "configs/tiny.py", "--workdir", str(workdir), "--config.model.emb_dim=64")
  assert_one_line_error(proc, str(workdir / "config.json"), "model.emb_dim")


def test_eval_of_a_directory_that_is_not_a_run(tmp_path):
  proc = run("eval.py", "--workdir", str(tmp_path / "nothing"))
  assert_one_line_error(proc, "config.json not found")

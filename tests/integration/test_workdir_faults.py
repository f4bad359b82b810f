"""A path that cannot be a work directory (or an output directory) ends every command in one line naming the path
and the cause, before any data is read: exit 74 where a directory cannot be created or written (a storage fault,
README "Faults and storage"), exit 2 where eval.py or translate.py is given a directory that is not a run."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, fresh_env

pytestmark = pytest.mark.slow  # starts processes

# A corpus folder that does not exist: a command that read its data before checking the work directory would
# end with the data's error (exit 2) instead.
NO_CORPUS = ["--config.data.source=folder", "--config.data.path={tmp}/no_corpus"]
COMMANDS = {"train": ["train.py", "--config", "configs/tiny.py", *NO_CORPUS],
            "inspect_data": ["-m", "gshard_mt.tools.inspect_data", "--config", "configs/tiny.py"],
            "prepare_data": ["-m", "gshard_mt.tools.prepare_data", "--config", "configs/tiny.py"]}


def run(args, tmp_path):
  return subprocess.run([sys.executable, *[a.format(tmp=tmp_path) for a in args]], capture_output=True, text=True,
                        timeout=300, cwd=ROOT, env=fresh_env())


def one_line(proc, status: int) -> str:
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == status, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-2000:]
  return lines[0]


def bad_paths(tmp_path) -> dict[str, tuple[str, str]]:
  """{case: (work directory, what the line must say)} for the cases this machine has."""
  (tmp_path / "notes.txt").write_text("a file where a directory should be")
  cases = {"parent_is_a_file": (f"{tmp_path}/notes.txt/run", f"{tmp_path}/notes.txt is a file, not a directory"),
           "path_is_a_file": (f"{tmp_path}/notes.txt", f"{tmp_path}/notes.txt is a file, not a directory")}
  if os.path.isdir("/proc/self"):  # nothing can be created in procfs, as root too
    cases["cannot_be_created"] = ("/proc/x", "cannot create the work directory in /proc (No such file or directory)")
  if os.path.isdir("/sys/kernel"):  # sysfs refuses new directories to every user, root included
    cases["no_permission"] = ("/sys/x", "operation not permitted" if os.geteuid() == 0 else "permission denied")
  return cases


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", ["parent_is_a_file", "path_is_a_file", "cannot_be_created", "no_permission"])
def test_a_work_directory_that_cannot_be_created(tmp_path, command, case):
  paths = bad_paths(tmp_path)
  if case not in paths:
    pytest.skip(f"{case}: this machine has no /proc or /sys to test it with")
  workdir, cause = paths[case]
  if command != "train":  # the prepared corpus goes under the work directory
    cause = cause.replace("work directory", "directory of the prepared corpus")
  line = one_line(run(COMMANDS[command] + ["--workdir", workdir], tmp_path), 74)
  assert line.split(": error: ", 1)[1].startswith(workdir) and cause in line, line


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write in any directory whatever its permissions; the "
                    "no_permission case (/sys) covers root")
def test_a_work_directory_without_permission(tmp_path):
  locked = tmp_path / "locked"
  locked.mkdir(mode=0o500)
  try:
    line = one_line(run(COMMANDS["train"] + ["--workdir", str(locked / "run")], tmp_path), 74)
  finally:
    locked.chmod(0o700)
  assert f"{locked}/run: permission denied" in line, line


@pytest.mark.parametrize("script", ["eval.py", "translate.py"])
@pytest.mark.parametrize("where", ["missing", "parent_is_a_file", "cannot_be_created"])
def test_eval_and_translate_of_a_directory_that_is_not_a_run(tmp_path, script, where):
  (tmp_path / "notes.txt").write_text("a file")
  workdir = {"missing": tmp_path / "nothing", "parent_is_a_file": tmp_path / "notes.txt" / "run",
             "cannot_be_created": "/proc/x"}[where]
  proc = subprocess.run([sys.executable, script, "--workdir", str(workdir)], input="", capture_output=True,
                        text=True, timeout=300, cwd=ROOT, env=fresh_env())
  line = one_line(proc, 2)
  assert line == f"{script}: error: {workdir}/config.json not found: is {workdir} a gshard_mt work directory?"
  assert not os.path.exists(f"{workdir}/eval")


@pytest.mark.parametrize("why, args, message", [
    ("a bad language", ["--config.data.languages=fra,zzz"], "unknown language code(s) ['zzz'] in data.languages"),
    ("a vocabulary too large", ["--config.data.languages=fra", "--config.data.vocab_size=100000"],
     "data.vocab_size=100000 is too large for this training data")])
def test_a_refused_start_leaves_the_work_directory_as_it_was(tmp_path, why, args, message):
  """A new work directory is not there after (nor the parents made for it); an old one holds what it held."""
  for workdir in (tmp_path / "new" / "run", tmp_path / "old"):
    (tmp_path / "old" / "notes").mkdir(parents=True, exist_ok=True)
    proc = run(COMMANDS["train"][:3] + ["--workdir", str(workdir), *args], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert message in proc.stderr.strip().splitlines()[-1], why  # after the log of the corpus read
  assert not (tmp_path / "new").exists()
  assert os.listdir(tmp_path / "old") == ["notes"] and os.listdir(tmp_path / "old" / "notes") == []


def test_ctrl_c_while_the_tokenizer_trains_ends_at_once_and_leaves_nothing(tmp_path):
  """SentencePiece trains in a process of its own: Ctrl-C ends the start within seconds, not when it is done."""
  workdir = tmp_path / "run"
  proc = subprocess.Popen([sys.executable, "train.py", "--config", "configs/tiny.py", "--workdir", str(workdir)],
                          stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=ROOT, env=fresh_env())
  said = next(line for line in proc.stderr if "training the tokenizer" in line or "Traceback" in line)
  assert "Ctrl-C stops it" in said and "s here" in said, said
  time.sleep(1)  # SentencePiece is at work
  proc.send_signal(signal.SIGINT)
  sent = time.perf_counter()
  rest = proc.stderr.read()
  assert proc.wait(timeout=60) == 130 and time.perf_counter() - sent < 5, rest
  assert rest.strip().splitlines()[-1] == "train.py: interrupted" and "Traceback" not in rest, rest
  assert not workdir.exists()

"""What every command shares: a user error ends it with one line and status 2, a storage fault with one line and
status 74, Ctrl-C with one line and 130; anything else is a bug."""

import errno
import os

import pytest

from gshard_mt import cli
from gshard_mt.errors import ConfigError, DataError, WorkdirError
from tests.helpers import started_as


@pytest.fixture(autouse=True)
def started_as_tool(monkeypatch):
  started_as(monkeypatch, ["python", "tool"])


@pytest.mark.parametrize("error", [ConfigError("moe.num_experts=3: bad"), DataError("x.de:4: invalid UTF-8"),
                                   WorkdirError("runs/x/config.json not found")])
def test_user_errors_exit_2_with_one_line(error, capsys):
  def main(argv):
    raise error

  with pytest.raises(SystemExit) as exit_info:
    cli.run(main, [])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err == f"tool: error: {error}\n"


@pytest.mark.parametrize("argv, name", [
    (["python", "-m", "gshard_mt.tools.export_hf"], "python -m gshard_mt.tools.export_hf"),
    (["python", "/home/me/gshard_mt/train.py"], "train.py")])
@pytest.mark.parametrize("args", [["--bogus"], []])
def test_a_command_s_usage_errors_and_its_own_name_it_alike(argv, name, args, monkeypatch, capsys):
  """The name the command was started by, as `python -m` typed it or a script's name: for argparse's errors and for
  the command's own (a module that named itself once used its file's name in one and the full path in the other)."""
  started_as(monkeypatch, [*argv, *args])

  def main(argv):
    cli.parser("doc").parse_args(argv)
    raise WorkdirError("runs/x/config.json not found")

  with pytest.raises(SystemExit) as exit_info:
    cli.run(main, args)
  assert exit_info.value.code == 2
  assert capsys.readouterr().err.startswith(f"{name}: error: {'unrecognized' if args else 'runs/x'}")


def test_other_errors_are_not_hidden():
  def main(argv):
    raise RuntimeError("a bug")

  with pytest.raises(RuntimeError, match="a bug"):
    cli.run(main, [])


@pytest.mark.parametrize("code, what", [(errno.ENOSPC, "disk full (No space left on device)"),
                                        (errno.EROFS, "read-only file system"), (errno.EACCES, "permission denied")])
def test_storage_faults_end_in_one_line_with_the_free_space(code, what, tmp_path, capsys, monkeypatch):
  exits = []
  monkeypatch.setattr(os, "_exit", exits.append)
  target = tmp_path / "run" / "metrics.jsonl"

  def main(argv):  # as Orbax reports a failed write: the OSError two levels down, in an exception group
    try:
      raise OSError(code, os.strerror(code), str(target))
    except OSError as e:
      raise ExceptionGroup("save failed", [RuntimeError("commit failed")]) from e

  cli.run(main, [])
  err = capsys.readouterr().err
  assert exits == [74] and err.count("\n") == 1
  assert err.startswith(f"tool: error: {target}: {what}; ") and " free on its filesystem" in err


def test_ctrl_c_outside_the_loop_is_one_line(capsys):
  def main(argv):
    raise KeyboardInterrupt

  with pytest.raises(SystemExit) as exit_info:
    cli.run(main, [])
  assert exit_info.value.code == 130 and capsys.readouterr().err == "tool: interrupted\n"


def test_config_with_overrides(tmp_path):
  from tests.helpers import ROOT

  parser = cli.parser("doc", config=True)
  parser.add_argument("--workdir")
  args, config = cli.parse_with_overrides(parser, ["--config", str(ROOT / "configs" / "tiny.py"), "--workdir", "w",
                                                   "--config.moe.num_experts=8"])
  assert args.workdir == "w" and config.moe.num_experts == 8
  with pytest.raises(ConfigError, match="unknown config key 'moe.num_expert'"):
    cli.parse_with_overrides(parser, ["--config", str(ROOT / "configs" / "tiny.py"), "--config.moe.num_expert=8"])


def test_a_directory_that_cannot_be_created_ends_in_one_line_with_74(tmp_path, capsys, monkeypatch):
  from gshard_mt import io

  exits = []
  monkeypatch.setattr(os, "_exit", exits.append)
  (tmp_path / "README.md").write_text("a file")
  cli.run(lambda argv: io.check_writable(tmp_path / "README.md" / "x", "work directory"), [])
  assert exits == [74]
  assert capsys.readouterr().err == (f"tool: error: {tmp_path}/README.md/x: cannot create the work directory: "
                                     f"{tmp_path}/README.md is a file, not a directory\n")


def test_counts_and_articles_in_messages():
  from gshard_mt.errors import article, counted

  assert [counted(n, "process", "processes") for n in (0, 1, 2)] == ["0 processes", "1 process", "2 processes"]
  assert counted(1, "slice") == "1 slice" and counted(3, "slice") == "3 slices"
  assert [article(w) for w in ("int", "float", "Example", "list")] == ["an int", "a float", "an Example", "a list"]


@pytest.mark.parametrize("make, help_command", [(False, "python eval.py --help"), (True, 'make eval ARGS="--help"')])
def test_a_wrong_argument_is_one_line_naming_it(make, help_command, capsys, monkeypatch):
  started_as(monkeypatch, ["python", "eval.py", "--workdir", "runs/tiny", "--split", "valid"], make=make)
  p = cli.parser("doc")
  p.add_argument("--split", choices=("dev", "test"))
  with pytest.raises(SystemExit) as exit_info:
    p.parse_args(["--split", "valid"])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and err.count("\n") == 1 and "usage" not in err
  assert "error: argument --split: invalid choice: 'valid'" in err and f"({help_command} lists the arguments)" in err

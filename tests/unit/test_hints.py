"""The commands messages suggest: written through make when make started the process, else as its python command,
and each one runs as printed (make's expansion of it, read back by the program's own argument parsing)."""

import shlex
import shutil
import subprocess

import pytest

from gshard_mt import cli, config_files, hints
from gshard_mt.errors import ConfigError
from tests.helpers import ROOT, small_config, started_as

TINY = "configs/tiny.py"
MAKE_TRAIN = [".venv/bin/python", "train.py", "--config", TINY, "--workdir", "runs/tiny"]  # `make train`'s command


def test_the_makefile_says_which_variable_carries_which_argument():
  found = hints.recipes()
  assert found["train.py"] == hints.Recipe("train", {"--config": "CONFIG", "--workdir": "WORKDIR"}, frozenset(),
                                           {"CONFIG": TINY, "WORKDIR": "runs/tiny"})
  assert found["eval.py"].variables == {"--workdir": "WORKDIR", "--split": "SPLIT"}
  assert found["gshard_mt.tools.sweep"].target == "sweep" and found["translate.py"].target == "translate"
  assert found["gshard_mt.tools.study"].fixed == {"--sweep"}  # `make study` has no variable for its sweep


def test_arguments_are_read_and_written_back():
  args = ["--config", TINY, "--config.moe.num_experts", "8", "--eval", "--mesh=data=2", "--languages", "fra"]
  parsed = hints.parse(args)
  assert parsed == {"--config": TINY, "--config.moe.num_experts": "8", "--eval": True, "--mesh": "data=2",
                    "--languages": "fra"}
  assert hints.join(parsed | {"--eval": None}) == ["--config", TINY, "--config.moe.num_experts=8", "--mesh",
                                                  "data=2", "--languages", "fra"]


def test_a_python_start_gets_its_own_command_back(monkeypatch):
  started_as(monkeypatch, ["python", "train.py", "--config", TINY, "--workdir", "runs/x", "--config.seed=2"])
  assert hints.command({"--config.num_train_steps": "1200"}) == (
      "python train.py --config configs/tiny.py --workdir runs/x --config.seed=2 --config.num_train_steps=1200")
  assert hints.command({"--help": True}, keep=False) == "python train.py --help"
  assert hints.command({"--sweep": "a b.py"}, program="gshard_mt.tools.sweep") == (
      "python -m gshard_mt.tools.sweep --sweep 'a b.py'")


def test_a_make_start_gets_a_make_command_without_the_defaults(monkeypatch):
  started_as(monkeypatch, [*MAKE_TRAIN, "--config.moe.num_experts=8"], make=True)
  assert hints.command({"--workdir": "runs/tiny-2"}) == (
      'make train WORKDIR=runs/tiny-2 ARGS="--config.moe.num_experts=8"')
  assert hints.command({"--config.moe.num_experts": None}) == "make train"
  assert hints.command({"--help": True}, keep=False) == 'make train ARGS="--help"'
  assert hints.command({"--workdir": "runs/b", "--split": "dev"}, program="eval.py") == (
      "make eval WORKDIR=runs/b SPLIT=dev")
  assert hints.command({"--sweep": "configs/sweeps/routers.py"}, program="gshard_mt.tools.sweep") == (
      "make sweep SWEEP=configs/sweeps/routers.py")
  assert hints.command({"--languages": "fra deu"}) == (
      "make train ARGS=\"--config.moe.num_experts=8 --languages 'fra deu'\"")
  assert hints.command({"--x": 'say "hi"'}) == (
      "make train 'ARGS=--config.moe.num_experts=8 --x '\"'\"'say \"hi\"'\"'\"''")


def test_a_program_the_makefile_does_not_run_is_written_as_python(monkeypatch):
  started_as(monkeypatch, ["python", "-m", "gshard_mt.tools.dryrun", "--devices", "8"], make=True)
  assert hints.command({"--mesh": "data=2,expert=4"}) == (
      "python -m gshard_mt.tools.dryrun --devices 8 --mesh data=2,expert=4")


def test_an_unused_directory_is_beside_the_given_one(tmp_path):
  (tmp_path / "run-2").mkdir()
  assert hints.unused(tmp_path / "run") == f"{tmp_path}/run-3"


def train_argv(hint: str, make: bool, program: str = "train.py") -> list[str]:
  """The arguments of `program` a printed command runs: make's own expansion of it (make -n), or the command."""
  words = shlex.split(hint)
  if not make:
    assert words[:2] == ["python", program]
    return words[2:]
  proc = subprocess.run(["make", "-n", "-s", *words[1:], "VENV=.venv-of-no-one"], cwd=ROOT, capture_output=True,
                        text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  line = next(line for line in proc.stdout.splitlines() if f" {program} " in line)
  return shlex.split(line)[2:]


@pytest.mark.parametrize("make", [False, True])
def test_the_hint_of_a_refused_work_directory_trains_the_config_elsewhere(make, monkeypatch, tmp_path):
  if make and not shutil.which("make"):
    pytest.skip("no make")
  workdir = tmp_path / "run"
  argv = ["--config", TINY, "--workdir", str(workdir), "--config.moe.num_experts=8"]
  started_as(monkeypatch, [".venv/bin/python" if make else "python", "train.py", *argv], make=make)
  config_files.save(small_config(), workdir)
  with pytest.raises(ConfigError) as refused:
    config_files.save(small_config(**{"moe.num_experts": 8}), workdir)
  hint = str(refused.value).split("use a new work directory: ")[1]
  parser = cli.parser("train.py", config=True)
  parser.add_argument("--workdir")
  args, config = cli.parse_with_overrides(parser, train_argv(hint, make))
  assert args.workdir == f"{workdir}-2" and config.moe.num_experts == 8 and args.config == TINY

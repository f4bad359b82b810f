"""Sweeps: commands per point and validation of every point before running."""

import pytest

from gshard_mt.errors import ConfigError
from gshard_mt.tools import sweep
from tests.helpers import ROOT


def test_print_only_lists_one_command_per_point(capsys, tmp_path):
  sweep.main(["--sweep", str(ROOT / "configs" / "sweeps" / "experts.py"), "--root", str(tmp_path), "--print_only",
              "--", "--config.num_train_steps=10"])
  lines = capsys.readouterr().out.strip().splitlines()
  assert len(lines) == 5
  assert "--config.model.moe_interval=0" in lines[0] and str(tmp_path / "dense") in lines[0]
  assert all(line.endswith("--config.num_train_steps=10") for line in lines)
  assert "--config.moe.num_experts=32" in lines[-1]


def test_every_shipped_sweep_point_is_valid():
  for path in (ROOT / "configs" / "sweeps").glob("*.py"):
    base, points = sweep.load_sweep(path)
    assert points and (ROOT / base).exists()


def test_bad_sweep_point_is_an_error_before_running(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("BASE = 'configs/tiny.py'\ndef get_sweep():\n  return [{'name': 'x', 'moe.num_expert': 4}]\n")
  with pytest.raises(ConfigError, match="unknown config key 'moe.num_expert'"):
    sweep.load_sweep(bad)
  bad.write_text("BASE = 'configs/tiny.py'\ndef get_sweep():\n  return [{'moe.num_experts': 4}]\n")
  with pytest.raises(ConfigError, match="unique 'name'"):
    sweep.load_sweep(bad)


def test_a_finished_sweep_writes_its_tables_and_picture(tmp_path, monkeypatch, capsys):
  """main's wiring, with training replaced by canned summaries: results.csv, results.md and results.png."""
  ran = []
  monkeypatch.setattr(sweep.subprocess, "run", lambda cmd, check: ran.append(cmd))
  monkeypatch.setattr(sweep, "summarize", lambda workdir, point: {
      **point, "parameters": 1e6, "step": 10, "dev_loss": 3.0 + len(point), "tokens_per_s": 1e4, "bleu": None})
  sweep.main(["--sweep", str(ROOT / "configs" / "sweeps" / "experts.py"), "--root", str(tmp_path)])
  assert len(ran) == 5 and "wrote" in capsys.readouterr().out
  assert {p.name for p in tmp_path.iterdir()} == {"results.csv", "results.md", "results.png"}

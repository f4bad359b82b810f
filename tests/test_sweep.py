"""Sweeps: commands per point, validation of every point before running, the results table."""

import shutil

import pytest

from gshard_mt import config as config_lib
from gshard_mt import sweep, train
from conftest import ROOT, small_config


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
  with pytest.raises(config_lib.ConfigError, match="unknown config key 'moe.num_expert'"):
    sweep.load_sweep(bad)
  bad.write_text("BASE = 'configs/tiny.py'\ndef get_sweep():\n  return [{'moe.num_experts': 4}]\n")
  with pytest.raises(config_lib.ConfigError, match="unique 'name'"):
    sweep.load_sweep(bad)


def test_results_table(tmp_path, tokenizer_dir):
  workdir = tmp_path / "e4"
  shutil.copytree(tokenizer_dir, workdir / "tokenizer")
  train.train_and_evaluate(small_config(eval_every=6), workdir)
  row = sweep.summarize(workdir, {"name": "e4", "moe.num_experts": 4})
  assert row["step"] == 6 and row["dev_loss"] > 0 and row["tokens_per_s"] > 0 and row["parameters"] > 0
  assert row["bleu"] is None
  table = sweep.write_tables([row], tmp_path)
  assert "| e4 | 4 |" in table and (tmp_path / "results.csv").read_text().startswith("name,moe.num_experts")

"""Sweeps: commands per point and validation of every point before running."""

import os
import threading
import time

import pytest
from etils import epath

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


def test_results_md_cells_read_as_numbers_of_their_kind(tmp_path):
  rows = [{"name": "e16", "parameters": 3652608, "dev_loss": 3.0, "tokens_per_s": 16730.4, "bleu": None,
           "optimizer.learning_rate": 3e-4, "model.dropout_rate": 0.1, "model.scan_layers": True}]
  sweep.write_tables(rows, epath.Path(tmp_path))
  assert (tmp_path / "results.md").read_text().splitlines()[-1] == (
      "| e16 | 3,652,608 | 3.000 | 16,730 | - | 0.0003 | 0.100 | True |")
  assert (tmp_path / "results.csv").read_text().splitlines()[-1] == "e16,3652608,3.0,16730.4,,0.0003,0.1,True"


def test_jobs_run_points_at_once_with_their_own_logs(tmp_path, monkeypatch):
  """--jobs N: the points run at the same time, each once, with its output (after the header line) in
  <point>/sweep.log, and their processes allocate device memory as they need it (JAX would otherwise take 75% of an
  accelerator per process) without the sweep's own environment changing."""
  monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
  together = threading.Barrier(3, timeout=10)  # breaks (and the test fails) unless all three run at once
  ran = []

  def fake_run(cmd, check, stdout, stderr, env):
    together.wait()
    stdout.write(f"ran {cmd[-1]}\n")
    ran.append((cmd[-1], env["XLA_PYTHON_CLIENT_PREALLOCATE"]))

  monkeypatch.setattr(sweep.subprocess, "run", fake_run)
  points = [{"name": f"p{i}"} for i in range(3)]
  sweep.run_points(points, lambda p, log: sweep.run(["train", p["name"]], p["name"], log), tmp_path, jobs=3)
  assert sorted(ran) == [(f"p{i}", "false") for i in range(3)]
  assert all((tmp_path / f"p{i}" / "sweep.log").read_text() == f"== p{i}: train p{i}\nran p{i}\n" for i in range(3))
  assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ


def test_the_first_failure_stops_the_sweep_and_names_its_log(tmp_path):
  started, slow_running = [], threading.Event()

  def run_point(point, log):
    started.append(point["name"])
    if point["name"] == "a":
      slow_running.wait(10)
      raise sweep.subprocess.CalledProcessError(1, ["train.py"])
    if point["name"] == "b":
      slow_running.set()
      time.sleep(0.3)  # still running when a fails: it finishes, c never starts

  with pytest.raises(RuntimeError, match=f"sweep point 'a' failed .*its output: {tmp_path / 'a' / 'sweep.log'}"):
    sweep.run_points([{"name": n} for n in "abc"], run_point, tmp_path, jobs=2)
  assert sorted(started) == ["a", "b"]


def test_jobs_one_runs_in_order_and_stops_at_a_failure(tmp_path):
  order = []

  def run_point(point, log):
    assert log is None  # one at a time: output straight to the terminal
    order.append(point["name"])
    if point["name"] == "b":
      raise sweep.subprocess.CalledProcessError(1, ["train.py"])

  with pytest.raises(sweep.subprocess.CalledProcessError):
    sweep.run_points([{"name": n} for n in "abc"], run_point, tmp_path, jobs=1)
  assert order == ["a", "b"]


def test_jobs_below_one_is_an_error_before_anything_runs(tmp_path):
  with pytest.raises(ConfigError, match="--jobs must be at least 1, got 0"):
    sweep.main(["--sweep", str(ROOT / "configs" / "sweeps" / "experts.py"), "--root", str(tmp_path), "--jobs", "0"])
  assert not any(tmp_path.iterdir())


def test_a_sweep_without_base_or_with_a_bad_key_names_the_file_and_the_point(tmp_path):
  no_base = tmp_path / "no_base.py"
  no_base.write_text("def get_sweep():\n  return [{'name': 'a'}]\n")
  with pytest.raises(ConfigError, match="no_base.py has no BASE, the config file its points change"):
    sweep.load_sweep(no_base)
  bad = tmp_path / "bad.py"
  bad.write_text("BASE = 'configs/tiny.py'\ndef get_sweep():\n  return [{'name': 'b', 'moe.num_expert': 8}]\n")
  with pytest.raises(ConfigError, match=r"bad.py, point 'b': unknown config key 'moe.num_expert'; did you mean"):
    sweep.load_sweep(bad)


def test_a_points_bleu_is_its_final_steps(tmp_path):
  """A point evaluated at step 10, then trained on to 20, has no BLEU of step 20 yet: not step 10's."""
  import json

  from gshard_mt import config_files
  from tests.helpers import small_config

  config_files.save(small_config(), tmp_path)
  rows = [{"step": 10, "tokens_per_s": 100.0}, {"step": 10, "dev_loss": 5.0},
          {"step": 20, "tokens_per_s": 100.0}, {"step": 20, "dev_loss": 4.0}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  for step, bleu in ((10, 1.5), (20, 2.5)):
    (tmp_path / f"eval/test-{step}").mkdir(parents=True)
    if step == 10:
      (tmp_path / f"eval/test-{step}/scores.json").write_text(json.dumps({"average": {"bleu": bleu}}))
  summary = sweep.summarize(epath.Path(tmp_path), {"name": "e4"})
  assert summary["step"] == 20 and summary["dev_loss"] == 4.0 and summary["bleu"] is None
  (tmp_path / "eval/test-20/scores.json").write_text(json.dumps({"average": {"bleu": 2.5}}))
  assert sweep.summarize(epath.Path(tmp_path), {"name": "e4"})["bleu"] == 2.5

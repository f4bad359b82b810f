"""Pictures of a run: written from metrics.jsonl and expert_load.jsonl, atomically, one routing row per layer."""

import json

import pytest

from gshard_mt.errors import WorkdirError
from gshard_mt.tools import plot


def fake_run(tmp_path, layers=("moe/encoder_0", "moe/decoder_0"), E=4):
  rows, loads = [], []
  for step in (10, 20, 30):
    row = {"step": step, "loss": 5.0 - step / 10, "aux_loss": 2.1, "learning_rate": 1e-3 * step / 30}
    for layer in layers:
      row |= {f"{layer}/top1_dropped": 0.01, f"{layer}/top2_dropped": 0.1, f"{layer}/load_cv": 0.2}
    rows.append(row)
    loads.append({"step": step} | {f"{layer}/load": [1 / E] * E for layer in layers})
  rows.append({"step": 30, "dev_loss": 4.0})
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (tmp_path / "expert_load.jsonl").write_text("".join(json.dumps(r) + "\n" for r in loads))
  return tmp_path


def test_writes_both_pictures(tmp_path):
  written = plot.plot_run(fake_run(tmp_path))
  assert [p.name for p in written] == ["training.png", "routing.png"]
  assert all(p.stat().st_size > 10_000 for p in written) and not list(tmp_path.glob(".*tmp*"))


def test_a_dense_run_has_no_routing_picture(tmp_path):
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0, "learning_rate": 1e-3}) + "\n")
  assert [p.name for p in plot.plot_run(tmp_path)] == ["training.png"]


def test_not_a_run_is_a_clear_error(tmp_path):
  with pytest.raises(WorkdirError, match="metrics.jsonl not found or empty"):
    plot.plot_run(tmp_path)

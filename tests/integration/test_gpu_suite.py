"""bench/gpu_suite.py --small: the whole accelerator suite at CPU sizes (the step profile included), its JSON and the
tables it prints (it writes no document)."""

import json
import subprocess
import sys

import pytest

from gshard_mt.moe.experts import PATHS as DISPATCHES
from tests.helpers import ROOT


@pytest.mark.slow
def test_small_suite_writes_every_section(tmp_path):
  proc = subprocess.run([sys.executable, "bench/gpu_suite.py", "--small", "--out", str(tmp_path / "results")],
                        capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  [path] = (tmp_path / "results").glob("*-cpu-small.json")
  assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [path.name]  # the JSON and nothing else
  result = json.loads(path.read_text())
  assert result["small"] and result["environment"]["platform"] == "cpu" and result["finished"]

  rows = result["moe_layer"]["rows"]
  # every dispatch after the dense baseline, then the grouped FFN alone (ragged_dot only, off a GPU)
  assert [r.get("dispatch") for r in rows[1:]] == list(DISPATCHES) + [None]
  assert [r.get("kernels") for r in rows if "kernels" in r] == ["RaggedDot()"] * 2
  assert rows[-1]["max_rel_diff_to_ragged_dot"] == 0.0
  assert all(r["ms"] > 0 and r["ratio_to_dense"] > 0 for r in rows)
  assert rows[0]["ratio_to_dense"] == 1.0

  assert [(r["config"], r["variant"]) for r in result["training"]] == [
      (f"configs/{c}.py", v) for c in ("base", "dense_base") for v in ("defaults", "all")]
  for r in result["training"]:
    assert r["step_ms"] > 0 and r["mfu"] is None  # no peak FLOP/s for a CPU
    assert r["row_lengths"] == [24, 16]  # --small's source / target rows
    assert 0 < r["tokens_per_step"] <= r["batch_size"] * sum(r["row_lengths"])  # real tokens, both sides
    assert r["tokens_per_s"] == pytest.approx(r["tokens_per_step"] / r["step_ms"] * 1e3)

  profiles = result["profile"]
  assert [p["config"] for p in profiles] == ["configs/base.py", "configs/dense_base.py"]
  for p in profiles:  # bench/profile_step.py's own test checks the accounting
    assert p["steps"] == 2 and p["unknown_ops"] == [] and p["parts"]["dropout"]["ms"] > 0
  assert "MoE expert matmuls" in profiles[0]["parts"] and "MoE expert matmuls" not in profiles[1]["parts"]

  decoding = result["decoding"]
  assert decoding["beam"] == 4 and decoding["sentences"] == 24 and decoding["sentences_per_s"] > 0

  text = proc.stdout
  assert "## Accelerator suite: cpu (" in text
  assert all(f"| MoE {d} dispatch" in text for d in DISPATCHES) and "| configs/dense_base.py |" in text
  assert "| configs/base.py | all | 8 x 24 / 16 |" in text and " | 1.00x | " in text
  assert "| part | configs/base.py ms | share | matmuls ms | configs/dense_base.py ms |" in text
  assert path.name in text

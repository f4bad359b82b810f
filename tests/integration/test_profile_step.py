"""bench/profile_step.py on the CPU: a traced training step of the small config split by part, end to end."""

import sys

import pytest

from tests.helpers import ROOT, small_config

sys.path.insert(0, str(ROOT / "bench"))
import profile_step  # noqa: E402


@pytest.mark.slow
def test_a_traced_step_by_part(data):
  from gshard_mt.training.setup import build

  config = small_config(**{"model.dropout_rate": 0.1})  # configs/tiny.py has none
  p = profile_step.profile(config, data, build(config, data.tokenizer.vocab_size), warmup=1, steps=2)
  assert p["steps"] == 2 and p["events"] > 0
  assert p["unknown_ops"] == []  # every operation is an instruction of the step's program, with its part
  operations = {name: r for name, r in p["parts"].items() if name != profile_step.IDLE}
  assert sum(r["ms"] for r in operations.values()) == pytest.approx(p["op_ms"])
  assert sum(r["matmul_ms"] for r in operations.values()) == pytest.approx(p["matmul_ms"])
  assert sum(r["share"] for r in p["parts"].values()) == pytest.approx(1)
  assert 0 <= p["idle_ms"] == pytest.approx(p["window_ms"] - p["busy_ms"]) and p["busy_ms"] <= p["op_ms"] * 1.0001
  assert operations["MoE expert matmuls"]["matmul_ms"] > 0 and operations["attention"]["ms"] > 0
  assert operations["dropout"]["ms"] > 0

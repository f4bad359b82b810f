"""Training metrics: MFU, active parameters, per-layer MoE summaries, the metrics file."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.training import metrics


def test_mfu_against_the_peak_table():
  assert metrics.mfu(494.5e12, "NVIDIA H100 80GB HBM3", 1) == pytest.approx(0.5)
  assert metrics.mfu(123e12, "TPU v3", 4) == pytest.approx(0.25)
  assert metrics.mfu(1e12, "cpu", 1) is None  # no peak known: no MFU rather than a wrong one


def test_active_params_count_two_of_the_experts():
  params = {"embed": {"embedding": jnp.zeros((10, 4))},  # 40
            "encoder": {"layer_1": {"moe": {"wg": jnp.zeros((4, 8)),  # router: always used, 32
                                            "wi": jnp.zeros((8, 4, 6)), "wo": jnp.zeros((8, 6, 4))}}}}  # 192 each
  assert metrics.active_params(params, num_experts=8) == pytest.approx(40 + 32 + 2 * (192 + 192) / 8)


def test_step_flops_count_each_side_with_its_own_tokens():
  """Encoder parameters work on source tokens, decoder ones and the output projection on target tokens; the
  embedding look-up is no matmul (with tied logits the table is the projection)."""
  params = {"embed": {"embedding": jnp.zeros((10, 4))}, "logits": jnp.zeros((4, 10)),  # 40 each
            "encoder": {"w": jnp.zeros((3, 4))}, "decoder": {"w": jnp.zeros((5, 4))}}  # 12, 20
  assert metrics.step_flops(params, 8, source_tokens=100, target_tokens=70) == 6 * (12 * 100 + (20 + 40) * 70)
  del params["logits"]
  assert metrics.step_flops(params, 8, source_tokens=100, target_tokens=70) == 6 * (12 * 100 + (20 + 40) * 70)


def test_moe_summary_per_layer():
  load = jnp.array([[0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4]])  # [U=2, E=4]
  stats = {"encoder": {"metrics": {"expert_load": load, "top1_dropped": jnp.array([0.0, 0.5]),
                                   "top2_dropped": jnp.array([0.1, 0.2])}}, "decoder": {}}
  out = metrics.moe_summary(stats)
  assert float(out["moe/encoder_0/load_cv"]) == pytest.approx(0.0)
  assert float(out["moe/encoder_1/load_cv"]) == pytest.approx(np.std([0.1, 0.2, 0.3, 0.4]) / 0.25, rel=1e-5)
  assert float(out["moe/encoder_1/top1_dropped"]) == 0.5 and float(out["moe/encoder_1/load_max"]) == pytest.approx(0.4)
  assert not any(k.startswith("moe/decoder") for k in out)


def test_writer_appends_json_lines_and_drops_non_finite(tmp_path):
  writer = metrics.Writer(tmp_path)
  writer.write(1, {"loss": 2.5, "bad": float("nan")})
  writer.write(2, {"loss": 2.0})
  writer.close()
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert rows == [{"step": 1, "loss": 2.5, "bad": None}, {"step": 2, "loss": 2.0}]

"""Training metrics (MFU: tests/unit/test_chips.py): active parameters, per-layer MoE summaries, the metrics file."""

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from gshard_mt import io
from gshard_mt.config.moe import MoeConfig
from gshard_mt.errors import WorkdirError
from gshard_mt.training import metrics


def test_active_params_count_two_of_the_experts():
  params = {"embed": {"embedding": jnp.zeros((10, 4))},  # 40
            "encoder": {"layer_1": {"moe": {"wg": jnp.zeros((4, 8)),  # router: always used, 32
                                            "wi": jnp.zeros((8, 4, 6)), "wo": jnp.zeros((8, 6, 4))}}}}  # 192 each
  assert metrics.active_params(params, num_experts=8, experts_per_token=2) == pytest.approx(40 + 32 + 2 * 384 / 8)


def test_step_flops_count_each_side_with_its_own_tokens():
  """Encoder parameters work on source tokens, decoder ones and the output projection on target tokens; the
  embedding look-up is no matmul (with tied logits the table is the projection)."""
  params = {"embed": {"embedding": jnp.zeros((10, 4))}, "logits": jnp.zeros((4, 10)),  # 40 each
            "encoder": {"w": jnp.zeros((3, 4))}, "decoder": {"w": jnp.zeros((5, 4))}}  # 12, 20
  assert metrics.step_flops(params, MoeConfig(), source_tokens=100, target_tokens=70) == 6 * (12 * 100 + 60 * 70)
  del params["logits"]
  assert metrics.step_flops(params, MoeConfig(), source_tokens=100, target_tokens=70) == 6 * (12 * 100 + 60 * 70)


@pytest.mark.parametrize("moe, k", [(MoeConfig(router="switch"), (1, 1)), (MoeConfig(router="gshard"), (2, 2)),
                                    (MoeConfig(router="topk", num_selected=3), (3, 3)),
                                    (MoeConfig(router="expert_choice", decoder_router="switch"), (2.5, 1)),
                                    (MoeConfig(router="expert_choice", decoder_router="topk",
                                               train_capacity_factor=5.0), (8, 2))])
def test_step_flops_count_each_sides_router_k_experts(moe, k):
  """The training loop, the dry run and the GPU suite all count the experts a token runs through, each side its
  router's (the dry run and the suite counted 2 whatever the router): k of E, or for expert choice, whose every
  slot holds a token, cf * k (at most E)."""
  experts = {"moe": {"wg": jnp.zeros((4, 8)), "wi": jnp.zeros((8, 4, 6)), "wo": jnp.zeros((8, 6, 4))}}  # 32 + 384
  params = {"embed": {"embedding": jnp.zeros((10, 4))}, "encoder": experts, "decoder": experts}
  per_side = [32 + n * 384 / 8 for n in k]
  flops = metrics.step_flops(params, dataclasses.replace(moe, num_experts=8), source_tokens=100, target_tokens=70)
  assert flops == pytest.approx(6 * (per_side[0] * 100 + (per_side[1] + 40) * 70))


def test_moe_summary_per_layer():
  load = jnp.array([[0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4]])  # [U=2, E=4]
  # Per layer and choice (first, second, third): asked for and dropped at capacity, as any router's Routing has them.
  wanted, dropped = jnp.array([[10.0, 10.0, 10.0], [10.0, 10.0, 0.0]]), jnp.array([[0.0, 1.0, 1.0], [5.0, 2.0, 0.0]])
  stats = {"encoder": {"metrics": {"expert_load": load, "requested_load": load, "choices_wanted": wanted,
                                   "choices_dropped": dropped}}, "decoder": {}}
  out = metrics.moe_summary(stats)
  assert float(out["moe/encoder_0/top1_dropped"]) == 0.0
  assert float(out["moe/encoder_0/top2_dropped"]) == pytest.approx(0.1)
  assert float(out["moe/encoder_1/top2_dropped"]) == pytest.approx(0.2)
  np.testing.assert_array_equal(out["moe/encoder_1/requested_load"], load[1])
  assert float(out["moe/encoder_0/load_cv"]) == pytest.approx(0.0)
  assert float(out["moe/encoder_1/load_cv"]) == pytest.approx(np.std([0.1, 0.2, 0.3, 0.4]) / 0.25, rel=1e-5)
  assert float(out["moe/encoder_1/top1_dropped"]) == 0.5 and float(out["moe/encoder_1/load_max"]) == pytest.approx(0.4)
  assert not any(k.startswith("moe/decoder") for k in out)


def test_writer_appends_json_lines_and_drops_non_finite(tmp_path):
  writer = metrics.Writer(tmp_path)
  writer.write(1, {"loss": 2.5, "bad": float("nan")})
  writer.write(2, {"loss": 2.0})
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert rows == [{"step": 1, "loss": 2.5, "bad": None}, {"step": 2, "loss": 2.0}]


def read_events(directory) -> list:
  """Every event of the TensorBoard files in `directory`, each record's length and CRCs checked as TensorBoard's
  reader checks them."""
  import struct

  from tensorboardX.proto import event_pb2
  from tensorboardX.record_writer import masked_crc32c

  events = []
  for path in sorted(directory.iterdir()):
    data, at = path.read_bytes(), 0
    while at < len(data):
      header = data[at:at + 8]
      (length,), (header_crc,) = struct.unpack("Q", header), struct.unpack("I", data[at + 8:at + 12])
      body = data[at + 12:at + 12 + length]
      (body_crc,) = struct.unpack("I", data[at + 12 + length:at + 16 + length])
      assert header_crc == masked_crc32c(header) and body_crc == masked_crc32c(body)
      events.append(event_pb2.Event.FromString(body))
      at += 16 + length
  return events


def test_tensorboard_events_are_valid_records(tmp_path):
  writer = metrics.Writer(tmp_path)
  writer.write(3, {"loss": 2.5, "bad": float("nan")})
  writer.write_vectors(3, {"moe/encoder_0/load": np.array([0.25, 0.75])})
  events = read_events(tmp_path / "tensorboard")
  assert events[0].file_version == "brain.Event:2"
  values = {v.tag: v for e in events[1:] for v in e.summary.value}
  assert {e.step for e in events[1:]} == {3} and values["loss"].simple_value == 2.5 and "bad" not in values
  assert values["moe/encoder_0/load"].histo.num == 2 and values["moe/encoder_0/load"].histo.sum == 1.0


def test_keep_until_drops_the_rows_past_a_step(tmp_path):
  writer = metrics.Writer(tmp_path)
  for step in (1, 2, 3, 4):
    writer.write(step, {"loss": float(step)})
    writer.write_vectors(step, {"load": [0.5, 0.5]})
  writer.write(2, {"dev_loss": 1.0})
  writer.keep_until(2)
  assert [r["step"] for r in io.read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 2]
  assert [r["step"] for r in io.read_jsonl(tmp_path / "expert_load.jsonl")] == [1, 2]
  # TensorBoard's files are appended to, not rewritten: a restart marker at step 3 makes it drop steps 3 and 4
  restarts = [e for e in read_events(tmp_path / "tensorboard") if e.HasField("session_log")]
  assert [(e.step, e.session_log.status) for e in restarts] == [(3, event_pb2.SessionLog.START)]
  writer.keep_until(0)  # a run that starts afresh
  assert io.read_jsonl(tmp_path / "metrics.jsonl") == [] and sorted(p.name for p in tmp_path.iterdir()) == [
      "expert_load.jsonl", "metrics.jsonl", "tensorboard"]


def test_a_row_cut_short_by_a_kill_is_dropped_at_resume_and_a_broken_row_is_named(tmp_path):
  """A kill or a full disk during an append leaves a last line without its newline: the resumed run (and every
  reader) leaves it out, and the next row starts on a line of its own. A broken line before the last is an error
  naming the file and line."""
  writer = metrics.Writer(tmp_path)
  for step in (1, 2):
    writer.write(step, {"loss": float(step)})
  path = tmp_path / "metrics.jsonl"
  with open(path, "a") as f:
    f.write('{"step": 3, "loss": ')
  assert [r["step"] for r in io.read_jsonl(path)] == [1, 2]
  writer.keep_until(2)
  writer.write(3, {"loss": 3.0})
  assert [r["step"] for r in io.read_jsonl(path)] == [1, 2, 3] and path.read_text().endswith("}\n")
  path.write_text('{"step": 1}\n{"step": 2,\n{"step": 3}\n')
  with pytest.raises(WorkdirError, match=r"metrics.jsonl:2: not a JSON line \("):
    io.read_jsonl(path)

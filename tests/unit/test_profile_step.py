"""bench/profile_step.py's accounting on a made-up trace: operations by part (each counting its own time, less the
operations nested in it), the idle gaps, streams at once, and which planes and events count (one GPU's, the step's)."""

import sys
from types import SimpleNamespace

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import profile_step  # noqa: E402

OPS = {"fusion.1": dict(part="dropout", matmul=False), "custom-call.2": dict(part="dense FFN", matmul=True),
       "fusion.4": dict(part="optimizer, gradient norm, finite check", matmul=False),
       "call.5": dict(part="attention", matmul=False, op_name="jit(train_step)/" + "x" * 100 + "/attention/exp"),
       "fusion.6": dict(part="attention", matmul=True)}
STREAM_1, STREAM_2, THREAD = ("/device:GPU:0", "Stream #1"), ("/device:GPU:0", "Stream #2"), ("/host:CPU", "t")
EVENTS = [profile_step.Event(STREAM_1, 0, 10, "fusion.1"), profile_step.Event(STREAM_1, 12, 20, "custom-call.2"),
          profile_step.Event(STREAM_1, 20, 30, "all-reduce-start.3"),  # not in the program: by its opcode
          profile_step.Event(STREAM_2, 5, 15, "fusion.4"),  # at once with stream 1
          profile_step.Event(THREAD, 40, 60, "call.5"), profile_step.Event(THREAD, 45, 50, "fusion.6")]  # nested


def test_own_times_leave_out_nested_operations():
  assert profile_step.own_times(EVENTS) == [10, 8, 10, 10, 15, 5]
  assert profile_step.busy_ns(EVENTS) == 30 + 20


def test_summary_by_part():
  s = profile_step.summarize(EVENTS, OPS, steps=2)
  ms = 1e-6 / 2
  assert s["unknown_ops"] == ["all-reduce-start.3"] and s["events"] == 6
  assert s["window_ms"] == pytest.approx(60 * ms) and s["idle_ms"] == pytest.approx(10 * ms)
  assert s["op_ms"] == pytest.approx(58 * ms) and s["overlap_ms"] == pytest.approx(8 * ms)
  got = {part: (round(r["ms"] / ms, 6), round(r["matmul_ms"] / ms, 6)) for part, r in s["parts"].items()}
  assert got == ({"collectives": (10, 0), "optimizer, gradient norm, finite check": (10, 0),
                  "dropout": (10, 0), "attention": (20, 5), "dense FFN": (8, 8),
                  profile_step.IDLE: (10, 0)})
  assert list(s["parts"])[0] == "collectives" and list(s["parts"])[-1] == profile_step.IDLE  # PARTS' order
  assert sum(r["share"] for r in s["parts"].values()) == pytest.approx(1)
  assert s["matmul_ms"] == pytest.approx(13 * ms)
  table = profile_step.table({"a": s, "b": s})
  assert "| dense FFN | 0.00 | 12% | 0.00 | 0.00 | 12% | 0.00 |" in table and table.count("\n") == 9


def test_longest_instructions():
  top = profile_step.summarize(EVENTS, OPS, steps=2)["top"]
  ms = 1e-6 / 2
  assert [t["op"] for t in top] == ["call.5", "fusion.1", "all-reduce-start.3", "fusion.4", "custom-call.2",
                                    "fusion.6"]  # by own time, ties in the trace's order
  assert top[0]["ms"] == pytest.approx(15 * ms) and top[-1]["ms"] == pytest.approx(5 * ms)
  assert top[0]["part"] == "attention" and top[0]["op_name"] == OPS["call.5"]["op_name"][-profile_step.TOP_NAME:]
  assert top[0]["op_name"].endswith("/attention/exp") and len(top[0]["op_name"]) == profile_step.TOP_NAME
  assert top[2]["part"] == "collectives" and top[2]["op_name"] == ""  # not in the program: by its opcode, as above
  text = profile_step.top_table(dict(top=top))
  assert text.count("\n") == 2 + len(top) and "| call.5 | 0.00 | attention | `" in text


def plane(name, events):
  line = SimpleNamespace(name="l", events=[SimpleNamespace(start_ns=s, end_ns=e, stats=list(stats.items()))
                                           for s, e, stats in events])
  return SimpleNamespace(name=name, lines=[line])


def test_device_planes_and_the_steps_module_only():
  mine = {"hlo_module": "jit_train_step", "hlo_op": "fusion.1"}
  host = plane("/host:CPU", [(0, 5, mine)])
  gpu = plane("/device:GPU:0", [(1, 2, mine), (2, 3, {"hlo_module": "jit_other", "hlo_op": "x"}),
                                (3, 4, {"correlation_id": 7})])
  other_gpu = plane("/device:GPU:1", [(1, 2, mine)])  # the same program: device 0 speaks for all
  assert profile_step.op_events([host, other_gpu, gpu], "jit_train_step") == [
      profile_step.Event(("/device:GPU:0", "l"), 1, 2, "fusion.1")]
  assert len(profile_step.op_events([host], "jit_train_step")) == 1  # the CPU backend: the host's threads

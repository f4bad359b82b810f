"""The upcycling study's plan (tools/upcycle_study): per seed a dense run, then the dense model continued and its
upcycled MoE from it for M steps, and a MoE from scratch for N + M, on one total-steps axis."""

import pathlib

from gshard_mt.tools import upcycle_study


def test_each_seed_trains_dense_first_then_three_arms_of_the_same_extra_steps():
  root = pathlib.Path("/runs/up")
  plan = upcycle_study.plan(root, 800, 300, seed=1)
  names = [point["name"] for point, _ in plan]
  assert names == ["dense_s1", "continued_s1", "upcycled_s1", "scratch_s1"]
  points = {point["name"]: (point, offset) for point, offset in plan}
  assert points["dense_s1"][0] == {"name": "dense_s1", "seed": 1, "model.moe_interval": 0, "num_train_steps": 800}
  for arm in ("continued_s1", "upcycled_s1"):
    point, offset = points[arm]
    assert (point["init_from"], point["num_train_steps"], offset) == (str(root / "dense_s1"), 300, 800)
  assert points["continued_s1"][0]["model.moe_interval"] == 0 and "model.moe_interval" not in points["upcycled_s1"][0]
  assert points["scratch_s1"] == ({"name": "scratch_s1", "seed": 1, "num_train_steps": 1100}, 0)

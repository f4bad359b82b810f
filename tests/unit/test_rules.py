"""The logical-axis rule tables, tested directly: what each logical axis maps to under each strategy."""

import flax.linen as nn
import pytest

from gshard_mt.moe import axes as moe
from gshard_mt.parallel import rules


def axis(name, table):
  return nn.logical_to_mesh_axes((name,), rules.RULES[table])[0]


@pytest.mark.parametrize("table, expected", [
    ("data", {"batch": "data", "group": "data", "expert": None, "mlp": None, "heads": None, "vocab": None,
              "embed": None}),
    ("expert", {"batch": ("data", "expert"), "group": ("data", "expert"), "expert": "expert", "mlp": None,
                "heads": None, "vocab": None, "embed": None}),
    ("expert_model", {"batch": ("data", "expert"), "group": ("data", "expert"), "expert": "expert",
                      "mlp": "model", "heads": "model", "vocab": "model", "embed": None}),
])
def test_each_logical_axis(table, expected):
  assert {name: axis(name, table) for name in expected} == expected
  for name in ("layers", "length", "capacity", "kv"):
    assert axis(name, table) is None


@pytest.mark.parametrize("table", ["expert", "expert_model"])
def test_dispatched_buffers_put_experts_on_the_expert_axis_and_groups_on_data(table):
  # EGCM: E takes 'expert' first, so G falls back to 'data'; EGCM_BY_GROUP (after the combine all-to-all) gives G both.
  assert tuple(nn.logical_to_mesh_axes(moe.EGCM, rules.RULES[table]))[:2] == ("expert", "data")
  assert tuple(nn.logical_to_mesh_axes(moe.EGCM_BY_GROUP, rules.RULES[table]))[1] == ("data", "expert")
  assert tuple(nn.logical_to_mesh_axes(moe.EMH, rules.RULES[table]))[0] == "expert"


def test_devices_of():
  sizes = {"data": 2, "expert": 4, "model": 3}
  assert rules.devices_of("batch", rules.RULES["expert"], sizes) == 8
  assert rules.devices_of("batch", rules.RULES["data"], sizes) == 2
  assert rules.devices_of("mlp", rules.RULES["expert_model"], sizes) == 3
  assert rules.devices_of("embed", rules.RULES["expert"], sizes) == 1
  assert rules.devices_of("no_such_axis", rules.RULES["expert"], sizes) == 1

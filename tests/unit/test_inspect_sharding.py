"""The sharding report's propagation through the MoE einsums: which collective each sharded einsum implies."""

import pytest

from gshard_mt.tools.inspect_sharding import einsum_collective


@pytest.mark.parametrize("equation, operands, result, expected", [
    ("GSM,ME->GSE", [("data", None, None), (None, None)], ("data", None, None), "none"),
    ("GSEC,GSM->EGCM", [("data", None, None, None), ("data", None, None)], (None, "data", None, None), "none"),
    ("GSEC,GSM->EGCM", [(("data", "expert"), None, None, None), (("data", "expert"), None, None)],
     ("expert", "data", None, None), "all-to-all over ['expert']"),
    ("EGCH,EHM->EGCM", [("expert", "data", None, "model"), ("expert", "model", None)],
     ("expert", "data", None, None), "all-reduce over ['model']"),
    ("GSM,ME->GSE", [("data", None, None), (None, None)], (None, None, None), "all-gather over ['data']"),
])
def test_einsum_collective(equation, operands, result, expected):
  assert einsum_collective(equation, operands, result) == expected

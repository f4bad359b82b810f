"""bench/moe_layer.py's check of the grouped FFN's kernels: a kernel that computes something else is marked
failed, not timed as if it were right."""

import dataclasses
import sys

from gshard_mt.moe import grouped
from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import moe_layer  # noqa: E402


@dataclasses.dataclass(frozen=True)
class OffByATenth(grouped.RaggedDot):
  """ragged_dot with the weight gradients 10% too large."""

  def by_rows(self, x, y, group_sizes, dtype):
    return super().by_rows(x, y, group_sizes, dtype) * 1.1


def test_a_wrong_kernel_is_marked_failed():
  rows = moe_layer.grouped_kernel_rows(300, 16, 32, 4, [grouped.RaggedDot(), OffByATenth()], repeats=1)
  assert [r["rows"] for r in rows] == [263, 263]  # 37 fewer: a multiple of no tile
  right, wrong = rows
  assert right["max_rel_diff_to_ragged_dot"] == 0.0 and "error" not in right and right["ms"] > 0
  assert 0.05 < wrong["max_rel_diff_to_ragged_dot"] < 0.2
  assert wrong["error"].startswith("differs from ragged_dot by ")

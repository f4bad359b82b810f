"""TPU topologies: their generation's row of the chip table (tests/unit/test_chips.py) and their errors; compiling
for TPU topologies is tested in tests/integration/test_tpu_compile.py."""

import sys

import pytest

from gshard_mt.errors import UserError
from gshard_mt.parallel import chips
from gshard_mt.tpu.estimates import tpu_compiler as tpu


@pytest.mark.parametrize("name, generation", [("v3:32x32", "v3"), ("v2", "v2"), ("v5p:2x2x1", "v5p"),
                                              ("v6e:16x16", "v6e")])
def test_chip_of_a_topology_or_generation(name, generation):
  assert tpu.chip_of(name).name == generation and tpu.chip_of(name) in chips.TPUS


def test_bad_topologies_fail_before_loading_libtpu(monkeypatch):
  with pytest.raises(UserError, match="unknown generation 'v9'; known: v2, v3, v4, v5e, v5p, v6e"):
    tpu.topology_devices("v9:2x2")
  with pytest.raises(UserError, match="expected GENERATION:SHAPE"):
    tpu.topology_devices("v3")
  monkeypatch.setitem(sys.modules, "libtpu", None)  # as if not installed
  with pytest.raises(UserError, match="needs libtpu: pip install libtpu"):
    tpu.topology_devices("v3:2x2")

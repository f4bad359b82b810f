"""The TPU table (HBM and peak bf16 per device as a libtpu topology gives devices) and topology errors; compiling
for TPU topologies is tested in tests/integration/test_tpu_compile.py."""

import sys

import pytest

from gshard_mt.errors import UserError
from gshard_mt.tools import tpu

GIB = 2**30


@pytest.mark.parametrize("name, generation, hbm_gib, tflops", [
    ("v3:32x32", "v3", 16, 61.5),  # the paper's: 123 TFLOP/s and 32 GiB per chip, one device per core
    ("v2:2x2", "v2", 8, 22.5),
    ("v4", "v4", 16, 137.5),  # libtpu's v4 topologies give one device per core too
    ("v5p:2x2x1", "v5p", 95, 459),  # one device per chip (its two cores as one)
    ("TPU v5 lite", "v5e", 16, 197),  # JAX's device kind
    ("v6e:16x16", "v6e", 32, 918),
])
def test_chip_of(name, generation, hbm_gib, tflops):
  chip = tpu.chip_of(name)
  assert chip.generation == generation
  assert chip.hbm_bytes == hbm_gib * GIB and chip.peak_flops == pytest.approx(tflops * 1e12)
  assert tpu.chip_of(chip.device_kind) is chip


def test_per_device_figures_split_the_chip():
  for chip in tpu.CHIPS.values():
    assert chip.hbm_bytes * chip.devices_per_chip == chip.hbm_bytes_per_chip
    assert chip.cores_per_chip % chip.devices_per_chip == 0


def test_bad_topologies_fail_before_loading_libtpu(monkeypatch):
  with pytest.raises(UserError, match="unknown generation 'v9'; known: v2, v3, v4, v5e, v5p, v6e"):
    tpu.topology_devices("v9:2x2")
  with pytest.raises(UserError, match="expected GENERATION:SHAPE"):
    tpu.topology_devices("v3")
  monkeypatch.setitem(sys.modules, "libtpu", None)  # as if not installed
  with pytest.raises(UserError, match="needs libtpu: pip install libtpu"):
    tpu.topology_devices("v3:2x2")

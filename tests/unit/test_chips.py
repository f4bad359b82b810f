"""The one table of accelerators: each device kind JAX reports maps to its row and its per-device peak and HBM;
a kind the table does not know (a CPU) gives no MFU."""

import sys
import types

import jax
import pytest

from gshard_mt.parallel import chips
from gshard_mt.training import metrics

GIB = 2**30


def device(kind, platform="tpu", num_cores=1):
  return types.SimpleNamespace(device_kind=kind, platform=platform, num_cores=num_cores)


@pytest.mark.parametrize("kind, platform, cores, name, tflops, hbm_gib", [
    ("TPU v2", "tpu", 1, "v2", 22.5, 8),  # one device per core, half a chip
    ("TPU v3", "tpu", 1, "v3", 61.5, 16),  # the paper's: 123 TFLOP/s and 32 GiB per chip
    ("TPU v4", "tpu", 2, "v4", 275, 32),  # a v4 host: one device per chip (megacore)
    ("TPU v4", "tpu", 1, "v4", 137.5, 16),  # libtpu's compile-only v4 topologies: one per core
    ("TPU v5 lite", "tpu", 1, "v5e", 197, 16),
    ("TPU v5", "tpu", 2, "v5p", 459, 95),  # JAX's kind for v5p; its two cores are one device
    ("TPU v6 lite", "tpu", 1, "v6e", 918, 32),
    ("NVIDIA H100 80GB HBM3", "gpu", None, "H100 SXM", 989.5, 80),
    ("NVIDIA H100 PCIe", "gpu", None, "H100 PCIe", 756, 80),
    ("NVIDIA H200", "gpu", None, "H200", 989.5, 141),
    ("NVIDIA A100-SXM4-40GB", "gpu", None, "A100 40GB", 312, 40),
    ("NVIDIA A100-SXM4-80GB", "gpu", None, "A100 80GB", 312, 80),
])
def test_each_device_kind_has_its_row_and_per_device_figures(kind, platform, cores, name, tflops, hbm_gib):
  d = device(kind, platform, cores)
  assert chips.chip_of(kind).name == name
  assert chips.peak_flops(d) == pytest.approx(tflops * 1e12) and chips.hbm_bytes(d) == hbm_gib * GIB
  assert metrics.mfu(tflops * 1e12 / 2, d, 1) == pytest.approx(0.5)


def test_kinds_are_matched_exactly_and_unknown_ones_give_no_mfu():
  assert chips.chip_of("TPU v5").name == "v5p" and chips.chip_of("TPU v5 lite").name == "v5e"
  assert chips.chip_of("TPU v5p") is None and chips.chip_of("H100") is None  # not kinds JAX reports
  cpu = jax.devices("cpu")[0]
  assert chips.peak_flops(cpu) is None and metrics.mfu(1e12, cpu, 1) is None
  kinds = [k for chip in chips.CHIPS for k in chip.device_kinds]
  assert len(kinds) == len(set(kinds))


@pytest.mark.skipif(sys.platform != "linux", reason="libtpu (the TPU compiler) has wheels for Linux only")
@pytest.mark.parametrize("topology, name, tflops", [
    ("v2:2x2", "v2", 22.5), ("v3:2x2", "v3", 61.5), ("v4:2x2x1", "v4", 137.5), ("v5e:2x2", "v5e", 197),
    ("v5p:2x2x1", "v5p", 459), ("v6e:2x2", "v6e", 918)])
def test_the_devices_of_libtpu_topologies(topology, name, tflops):
  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  d = tpu.topology_devices(topology)[0]
  assert chips.chip_of(d.device_kind).name == name and tpu.chip_of(topology).name == name
  assert chips.peak_flops(d) == pytest.approx(tflops * 1e12)

"""The one table of accelerators (for MFU, the dry run's MFU bound and its HBM check): peak dense bf16 FLOP/s and
HBM per chip, and the device kinds JAX gives them, matched exactly ("TPU v5", v5p, is a prefix of "TPU v5 lite").

A TPU device is `num_cores` of its chip's TensorCores (v2, v3: one per core; v5p: both, "megacore"; v4: one per
chip on a v4 host, one per core in libtpu's compile-only topologies); a GPU device is a whole GPU.
"""

from __future__ import annotations

import dataclasses

GIB = 2**30
MIB = 2**20


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator, per chip as its maker's pages give it ("GB" of HBM read as GiB, as the GPUs hold it)."""

  name: str  # a TPU's generation as libtpu's topology names write it ('v5p'), or the GPU's model
  device_kinds: tuple[str, ...]  # `jax.Device.device_kind` of its devices, matched exactly
  peak_flops_per_chip: float  # dense bf16
  hbm_bytes_per_chip: int
  cores_per_chip: int  # TensorCores of a TPU; 1 for a GPU
  source: str
  # VMEM per TensorCore as the TPU compiler gives it (libtpu 0.0.52), for Pallas kernels; None for GPUs and for
  # v2 and v3, where Mosaic takes no bf16 matmul operand (`kernels.vmem`)
  vmem_bytes: int | None = None

  @property
  def peak_flops_per_core(self) -> float:
    return self.peak_flops_per_chip / self.cores_per_chip


TPUS = (  # cloud.google.com/tpu/docs/<generation>; v2: 45 TFLOP/s per chip (180 per 4-chip board)
    Chip("v2", ("TPU v2",), 45e12, 16 * GIB, 2, "cloud.google.com/tpu/docs/v2; Jouppi et al. 2020"),
    Chip("v3", ("TPU v3",), 123e12, 32 * GIB, 2, "cloud.google.com/tpu/docs/v3"),
    Chip("v4", ("TPU v4",), 275e12, 32 * GIB, 2, "cloud.google.com/tpu/docs/v4", 16 * MIB),
    Chip("v5e", ("TPU v5 lite",), 197e12, 16 * GIB, 1, "cloud.google.com/tpu/docs/v5e", 128 * MIB),
    Chip("v5p", ("TPU v5",), 459e12, 95 * GIB, 2, "cloud.google.com/tpu/docs/v5p", 64 * MIB),
    Chip("v6e", ("TPU v6 lite",), 918e12, 32 * GIB, 1, "cloud.google.com/tpu/docs/v6e", 128 * MIB),
)
GPUS = (  # nvidia.com data sheets: dense (not 2:4 sparse) bf16 tensor-core FLOP/s
    Chip("H100 SXM", ("NVIDIA H100 80GB HBM3",), 989.5e12, 80 * GIB, 1, "NVIDIA H100 data sheet"),
    Chip("H100 PCIe", ("NVIDIA H100 PCIe",), 756e12, 80 * GIB, 1, "NVIDIA H100 data sheet"),
    Chip("H200", ("NVIDIA H200",), 989.5e12, 141 * GIB, 1, "NVIDIA H200 data sheet"),
    Chip("A100 40GB", ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"), 312e12, 40 * GIB, 1,
         "NVIDIA A100 data sheet"),
    Chip("A100 80GB", ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"), 312e12, 80 * GIB, 1,
         "NVIDIA A100 data sheet"),
)
CHIPS = TPUS + GPUS


def chip_of(device_kind: str) -> Chip | None:
  """The row whose devices JAX names `device_kind`; None for any other (a CPU)."""
  return next((chip for chip in CHIPS if device_kind in chip.device_kinds), None)


def chip_share(device) -> tuple[Chip | None, float]:
  """(its chip's row, the fraction of that chip it is) of a `jax.Device`."""
  chip = chip_of(device.device_kind)
  if chip is None or device.platform != "tpu":
    return chip, 1.0
  return chip, device.num_cores / chip.cores_per_chip


def peak_flops(device) -> float | None:
  """Peak dense bf16 FLOP/s of one JAX device; None where the table has no row for its kind."""
  chip, share = chip_share(device)
  return None if chip is None else chip.peak_flops_per_chip * share


def hbm_bytes(device) -> int | None:
  """HBM of one JAX device; None where the table has no row for its kind."""
  chip, share = chip_share(device)
  return None if chip is None else int(chip.hbm_bytes_per_chip * share)

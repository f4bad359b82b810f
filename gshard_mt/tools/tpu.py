"""The real TPU compiler on any machine: compile-only devices of a TPU topology (libtpu, no TPU needed) and the
published figures of each TPU generation (HBM and peak bf16 FLOP/s), per device as the topology gives devices.

A topology is named as libtpu names it: 'v3:32x32' is 32x32 v3 chips, 2,048 cores. v2, v3 and v4 topologies give
one device per TensorCore (two per chip); v5p gives one per chip (its two cores work as one, "megacore"); v5e and
v6e chips have one core.
"""

from __future__ import annotations

import dataclasses
import os

from gshard_mt import cli
from gshard_mt.errors import UserError

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation, per chip as Google's Cloud TPU pages give it, and how a topology splits a chip."""

  generation: str
  device_kind: str  # as JAX names its devices
  hbm_bytes_per_chip: int
  peak_flops_per_chip: float  # bf16
  cores_per_chip: int  # TensorCores
  devices_per_chip: int  # compile-only devices per chip in a libtpu topology
  source: str

  @property
  def hbm_bytes(self) -> int:
    """HBM per device."""
    return self.hbm_bytes_per_chip // self.devices_per_chip

  @property
  def peak_flops(self) -> float:
    """Peak bf16 FLOP/s per device."""
    return self.peak_flops_per_chip / self.devices_per_chip


# cloud.google.com/tpu/docs/<generation> (v2: the 45 TFLOP/s per chip of the v2 launch, 180 per 4-chip board).
# The v5e, v5p and v6e pages write HBM in "GB"; taken here as GiB, like the v3 and v4 pages write it.
CHIPS = {c.generation: c for c in (
    Chip("v2", "TPU v2", 16 * GIB, 45e12, 2, 2, "cloud.google.com/tpu/docs/v2; Jouppi et al. 2020"),
    Chip("v3", "TPU v3", 32 * GIB, 123e12, 2, 2, "cloud.google.com/tpu/docs/v3"),
    Chip("v4", "TPU v4", 32 * GIB, 275e12, 2, 2, "cloud.google.com/tpu/docs/v4"),
    Chip("v5e", "TPU v5 lite", 16 * GIB, 197e12, 1, 1, "cloud.google.com/tpu/docs/v5e"),
    Chip("v5p", "TPU v5", 95 * GIB, 459e12, 2, 1, "cloud.google.com/tpu/docs/v5p"),
    Chip("v6e", "TPU v6 lite", 32 * GIB, 918e12, 1, 1, "cloud.google.com/tpu/docs/v6e"),
)}


def chip_of(name: str) -> Chip:
  """The row for a topology name ('v3:32x32'), a generation ('v3') or a device kind ('TPU v5 lite')."""
  for chip in CHIPS.values():
    if name == chip.device_kind:
      return chip
  generation = name.partition(":")[0].strip().lower()
  if generation not in CHIPS:
    raise UserError(f"TPU topology {name!r}: unknown generation {generation!r}; known: {', '.join(CHIPS)}")
  return CHIPS[generation]


def topology_devices(name: str) -> list:
  """Compile-only devices of the TPU topology `name` (e.g. 'v3:32x32'): `jax.jit(...).lower(...).compile()` on
  them runs the real TPU compiler, with no TPU present. Needs libtpu (`pip install libtpu`)."""
  chip = chip_of(name)
  if ":" not in name:
    raise UserError(f"TPU topology {name!r}: expected GENERATION:SHAPE, e.g. v3:2x2 or v5p:2x2x1")
  try:
    import libtpu  # noqa: F401
  except ImportError:
    raise UserError("compiling for a TPU topology needs libtpu: pip install libtpu (or '.[test]')") from None
  # libtpu locks a file so that one process owns the TPU; compile-only devices own nothing, so several dry runs
  # (and the tests) may share it.
  os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
  cli.quiet_tpu_host_lookup()
  import jax
  from jax.experimental import topologies

  try:
    devices = topologies.get_topology_desc(platform="tpu", topology_name=name).devices
  except jax.errors.JaxRuntimeError as e:
    raise UserError(f"TPU topology {name!r} not accepted by libtpu: {str(e).splitlines()[0]}") from None
  if devices[0].num_cores != chip.cores_per_chip // chip.devices_per_chip:
    raise UserError(f"TPU topology {name!r}: libtpu gives devices of {devices[0].num_cores} cores, which the "
                    f"table in gshard_mt/tools/tpu.py does not expect for {chip.generation}")
  return list(devices)


def compiler_cost(compiled) -> dict[str, float]:
  """The compiler's own totals for one execution: 'flops', 'bytes accessed' (per device) and 'optimal_seconds'
  (its cost model's time, a lower bound). Each counts a loop body once, whatever its trip count."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost  # one entry per program in older JAX
  return {k: float(cost.get(k, 0.0)) for k in ("flops", "bytes accessed", "optimal_seconds")}


def estimate(compiled) -> dict:
  """What a compiled TPU program costs per device and execution, loops counted as often as they run:
  'flops', 'bytes accessed', 'transcendentals' (gshard_mt.tools.hlo.costs), the compiler's own 'compiler_flops'
  and 'compiler_seconds' (loop bodies once; `compiler_cost`)."""
  from gshard_mt.tools import hlo

  raw = compiler_cost(compiled)
  return {**hlo.costs(compiled.as_text()), "compiler_flops": raw["flops"], "compiler_seconds": raw["optimal_seconds"]}

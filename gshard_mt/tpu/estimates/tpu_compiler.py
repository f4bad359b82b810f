"""The real TPU compiler on any machine: compile-only devices of a TPU topology (libtpu, no TPU needed) and the
compiler's own cost of a program. Each generation's figures are in `gshard_mt.parallel.chips`.

A topology is named as libtpu names it: 'v3:32x32' is 32x32 v3 chips, 2,048 cores. v2, v3 and v4 topologies give
one device per TensorCore (two per chip); v5p gives one per chip (its two cores work as one, "megacore"); v5e and
v6e chips have one core.
"""

from __future__ import annotations

import os

import jax
from jax.experimental import topologies

from gshard_mt import xla_flags
from gshard_mt.errors import UserError
from gshard_mt.parallel import chips
from gshard_mt.tpu.estimates import hlo

GENERATIONS = {chip.name: chip for chip in chips.TPUS}


def chip_of(name: str) -> chips.Chip:
  """The row of a topology name ('v3:32x32') or a generation ('v3')."""
  generation = name.partition(":")[0].strip().lower()
  if generation not in GENERATIONS:
    raise UserError(f"TPU topology {name!r}: unknown generation {generation!r}; known: {', '.join(GENERATIONS)}")
  return GENERATIONS[generation]


def topology_devices(name: str) -> list:
  """Compile-only devices of the TPU topology `name` (e.g. 'v3:32x32'): `jax.jit(...).lower(...).compile()` on
  them runs the real TPU compiler, with no TPU present. Needs libtpu (`pip install libtpu`)."""
  chip_of(name)
  if ":" not in name:
    raise UserError(f"TPU topology {name!r}: expected GENERATION:SHAPE, e.g. v3:2x2 or v5p:2x2x1")
  try:
    import libtpu  # noqa: F401  optional: the TPU compiler, installed by the test extra and on TPU VMs
  except ImportError:
    raise UserError("compiling for a TPU topology needs libtpu: pip install libtpu (or '.[test]')") from None
  # libtpu locks a file so that one process owns the TPU; compile-only devices own nothing, so several dry runs
  # (and the tests) may share it.
  os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
  # No persistent compilation cache: a compile-only device has no client to load a cached program into (JAX warns
  # "PjRtCompiler must be constructed with a Client" for each), and what it compiles is never run.
  jax.config.update("jax_enable_compilation_cache", False)
  xla_flags.quiet_tpu_host_lookup()
  try:
    return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
  except jax.errors.JaxRuntimeError as e:
    raise UserError(f"TPU topology {name!r} not accepted by libtpu: {str(e).splitlines()[0]}") from None


def one_chip(name: str):
  """(the first compile-only device of topology `name`, a SingleDeviceSharding on it): for estimating one chip's
  share of a program."""
  device = topology_devices(name)[0]
  return device, jax.sharding.SingleDeviceSharding(device)


def compiler_cost(compiled) -> dict[str, float]:
  """The compiler's own totals for one execution: 'flops', 'bytes accessed' (per device) and 'optimal_seconds'
  (its cost model's time, a lower bound). Each counts a loop body once, whatever its trip count."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost  # one entry per program in older JAX
  return {k: float(cost.get(k, 0.0)) for k in ("flops", "bytes accessed", "optimal_seconds")}


def estimate(compiled) -> dict:
  """What a compiled TPU program costs per device and execution, loops counted as often as they run:
  'flops', 'bytes accessed', 'transcendentals' (gshard_mt.tpu.estimates.hlo.costs), the compiler's own 'compiler_flops'
  and 'compiler_seconds' (loop bodies once; `compiler_cost`)."""
  raw = compiler_cost(compiled)
  return {**hlo.costs(compiled.as_text()), "compiler_flops": raw["flops"], "compiler_seconds": raw["optimal_seconds"]}

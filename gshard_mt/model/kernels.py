"""What our Pallas kernels for TPUs (`pallas_attention`, `pallas_logits`) share: the choice between the compiled
kernel and Pallas's interpret mode, and running a kernel on each device's rows of a mesh."""

from __future__ import annotations

import flax.linen as nn
import jax


def on_tpu(run, *args):
  """`run(interpret=False)` compiled for a TPU, Pallas's interpret mode for any other platform: chosen where the
  program is lowered, not by the host's default backend (a TPU program compiled ahead of time on a CPU host gets
  the kernels)."""
  return jax.lax.platform_dependent(*args, tpu=run(False), default=run(True))


def per_device(fn, split: tuple[bool, ...]):
  """`fn` on each device's rows when a mesh is set: under `shard_map` over the batch's mesh axes, the arguments
  marked in `split` (pytrees alike) and the outputs split by their first dimension, the others whole on every
  device. check_vma=False: the kernels' outputs vary over the batch's axes as their inputs do, which Pallas cannot
  infer; shard_map's transpose then sums the whole arguments' per-device cotangents over those axes."""
  mesh = jax.sharding.get_abstract_mesh()
  batch = nn.logical_to_mesh_axes(("batch",))[0] if not mesh.empty else None
  if batch is None:
    return fn
  rows, whole = jax.sharding.PartitionSpec(batch), jax.sharding.PartitionSpec()
  return jax.shard_map(fn, mesh=mesh, in_specs=tuple(rows if s else whole for s in split), out_specs=rows,
                       check_vma=False)

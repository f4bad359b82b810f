"""The manual path (`moe.dispatch="shard_map"`): dispatch, expert FFN and combine written per device.

GShard's "mixing manual and automatic sharding": gating stays automatic (group-local); the expert part runs in
`jax.shard_map` with the all-to-alls spelled out. A device dispatches its G/n_g groups to [E, G/n_g, C, M] buffers;
an all-to-all over the expert axis trades them for [E/n_e, G·n_e/n_g, C, M] (its experts' slots from its peers'
groups), and a second sends the outputs back. With H split over a model axis, one psum completes the output.

`check_vma=True` types every value as device-varying or invariant along each axis, so the transposes are the
efficient ones: the forward psum transposes to a no-op, and the backward's only all-reduces are those the math needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from gshard_mt.moe.dispatch import IndexDispatcher
from gshard_mt.moe.ffn import BufferLayout, ExpertWeights, apply_experts
from gshard_mt.moe.gating import Routing


def axes_of(entry) -> tuple[str, ...]:
  """The mesh axes of one PartitionSpec entry (None, a name or a tuple of names)."""
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def moe_shard_map(x: jax.Array, routing: Routing, weights: ExpertWeights, activation: Callable,
                  output: Callable | None = None, *,
                  group_spec: P, expert_spec: P, check_vma: bool = True) -> jax.Array:
  """x [G, S, M], its routing ([G, S, K] fields), the experts' weights (wi [E, M, H], global shapes) -> y [G, S, M],
  placed like x and equal to the automatic path's: `ffn.apply_experts` on each device's buffers [E', G', C, M] and
  weights [E', M, H'], summed over the model axis when H is split. group_spec: the mesh placement of [G, S, M];
  expert_spec: that of wi. check_vma: track device variance (off only to show what it saves).
  """
  mesh = jax.sharding.get_abstract_mesh()
  group_axes, expert_axes, model_axes = axes_of(group_spec[0]), axes_of(expert_spec[0]), axes_of(expert_spec[2])
  sizes = {} if mesh.empty else dict(mesh.shape)
  _check_specs(group_axes, expert_axes, model_axes, axes_of(expert_spec[1]), sizes)
  expert_axis = expert_axes[0] if expert_axes and sizes.get(expert_axes[0], 1) > 1 else None
  model_axis = model_axes[0] if model_axes and sizes.get(model_axes[0], 1) > 1 else None

  def per_device(x, routing, weights):
    """One device's shards: x [G', S, M], routing [G', S, K], weights (wi [E', M, H']) -> [G', S, M]."""
    dispatcher = IndexDispatcher(routing)
    buffers = dispatcher.dispatch(x)  # [E, G', C, M], this device's groups
    if expert_axis:  # E split, G gathered: [E/n_e, G'·n_e, C, M]
      buffers = jax.lax.all_to_all(buffers, expert_axis, split_axis=0, concat_axis=1, tiled=True)
    out = apply_experts(buffers, weights, BufferLayout(constrain=False, model_axis=model_axis), activation, output)
    if expert_axis:  # back to [E, G', C, M]
      out = jax.lax.all_to_all(out, expert_axis, split_axis=1, concat_axis=0, tiled=True)
    return dispatcher.combine(out)

  routing = routing.replace(aux_loss=None, z_loss=None, metrics={}, requested=None)  # the [G, S, K] fields only
  manual_axes = {a for a, n in sizes.items() if n > 1}
  if not manual_axes:  # one device (or no mesh): the per-device program is the whole program
    return per_device(x, routing, weights)

  def spec(*entries):
    """A PartitionSpec over the manual axes only: size-1 axes stay automatic (a psum over one device is still an
    all-reduce in the HLO)."""
    return P(*(tuple(a for a in axes_of(e) if a in manual_axes) or None for e in entries))

  G = x.shape[0]
  shards = math.prod(sizes[a] for a in group_axes)
  pad = -G % shards  # extra groups with nothing kept (an evaluation batch need not divide over the devices)
  if pad:
    x, routing = jax.tree.map(lambda a: jnp.pad(a, ((0, pad), (0, 0), (0, 0))), (x, routing))
  gsm = spec(group_spec[0], None, None)
  weight_specs = weights.replace(
      wi=spec(*expert_spec), wo=spec(expert_spec[0], expert_spec[2], None),
      bi=None if weights.bi is None else spec(expert_spec[0], expert_spec[2]),
      bo=None if weights.bo is None else spec(expert_spec[0], None))
  y = jax.shard_map(per_device, mesh=mesh, axis_names=manual_axes, check_vma=check_vma,
                    in_specs=(gsm, gsm, weight_specs), out_specs=gsm)(x, routing, weights)
  return y[:G]


def _check_specs(group_axes, expert_axes, model_axes, embed_axes, sizes: dict) -> None:
  if len(expert_axes) > 1 or len(model_axes) > 1 or embed_axes:
    raise ValueError(f"moe.dispatch='shard_map' supports experts on one mesh axis, H on at most one and M "
                     f"unsplit; the partitioning rules give E {expert_axes}, M {embed_axes}, H {model_axes}")
  if expert_axes and sizes.get(expert_axes[0], 1) > 1 and expert_axes[0] not in group_axes:
    raise ValueError(f"moe.dispatch='shard_map' needs the groups split over the expert axis "
                     f"{expert_axes[0]!r} too (groups are on {group_axes}): the all-to-all trades groups for "
                     "experts along it")

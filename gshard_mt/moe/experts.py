"""The experts' half of the MoE layer (GShard Algorithm 2 after gating), one class per `moe.dispatch` behind one
interface: `path(x [G, S, M], routing, weights: ffn.ExpertWeights) -> y [G, S, M]`: dispatch, the experts' FFN
(`ffn.apply_experts`, the same function on every path, in the path's layout), combine weighted by the gates.

- `Buffers` ('einsum', 'index', 'index_gather'): capacity buffers [E, G, C, M], whose sharding constraints are
  the G -> E and E -> G all-to-alls; the FFN by XLA's einsums, or by the experts' kernel the run's `Ops` holds;
- `Grouped` ('grouped'): rows in blocks by expert, grouped matmuls over the kept assignments only (`grouped`);
- `ShardMap` ('shard_map'): the manual path, its all-to-alls written out (`manual`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from gshard_mt.config.moe import MoeConfig
from gshard_mt.moe import dispatch, ffn, grouped, manual
from gshard_mt.moe.axes import EGCM, EGCM_BY_GROUP, EMH, GSM
from gshard_mt.moe.gating import Routing
from gshard_mt.ops import Ops
from gshard_mt.registry import Registry

ACTIVATIONS = Registry("moe.activation").add({"relu": ffn.relu, "gelu": jax.nn.gelu})


@dataclasses.dataclass(frozen=True)
class ExpertPath:
  """The interface: the MoE section `cfg`, `dtype` of the tokens and of the experts' computation, and the optional
  kernels the run picked (`ops`: the experts' FFN on buffers, the grouped matmuls)."""

  cfg: MoeConfig
  dtype: Any = jnp.float32
  ops: Ops = Ops()
  output: Callable | None = None  # on each expert's output (`ffn.output_dropout`)
  capacity_buffers: ClassVar[bool] = False  # fills [E, G, C, M] buffers (what the experts' kernel runs on)

  def __call__(self, x: jax.Array, routing: Routing, weights: ffn.ExpertWeights) -> jax.Array:
    raise NotImplementedError


class Buffers(ExpertPath):
  """Capacity buffers, filled by `dispatch.DISPATCHERS[moe.dispatch]`. The weights stay float32: weight_einsum
  casts them and keeps their gradients float32; the experts' kernel (ReLU, no biases) casts them itself and runs
  the all-to-alls itself."""

  capacity_buffers: ClassVar[bool] = True

  def experts(self, buffers: jax.Array, weights: ffn.ExpertWeights) -> jax.Array:
    """The experts' FFN on the dispatched buffers [E, G, C, M] -> [E, G, C, M]."""
    if self.ops.expert_ffn is not None:  # no biases nor output dropout: kernels.seam.check refuses them
      buffers = nn.with_logical_constraint(buffers, EGCM_BY_GROUP)
      return self.ops.expert_ffn(buffers, weights.wi, weights.wo, EGCM_BY_GROUP, EMH)
    buffers = nn.with_logical_constraint(buffers, EGCM)  # G -> E reshard: an all-to-all
    return ffn.apply_experts(buffers, weights, ffn.BufferLayout(), ACTIVATIONS[self.cfg.activation],
                             self.output)

  def __call__(self, x, routing, weights):
    dispatcher = dispatch.make_dispatcher(self.cfg.dispatch, routing)
    out = nn.with_logical_constraint(self.experts(dispatcher.dispatch(x), weights), EGCM_BY_GROUP)  # E -> G
    return nn.with_logical_constraint(dispatcher.combine(out), GSM)


class Grouped(ExpertPath):
  """Rows in blocks by expert, the grouped matmuls of moe.grouped_kernel; the weights in their own dtype (their
  gradients stay in it)."""

  def __call__(self, x, routing, weights):
    dispatcher = dispatch.GroupedDispatcher(routing)
    kernels = self.ops.grouped_matmuls or grouped.RaggedDot()
    layout = grouped.RowLayout(dispatcher.group_sizes, dispatcher.num_rows, kernels)
    rows = ffn.apply_experts(dispatcher.dispatch(x), weights, layout, ACTIVATIONS[self.cfg.activation], self.output)
    return nn.with_logical_constraint(dispatcher.combine(rows), GSM)


class ShardMap(ExpertPath):
  """Dispatch, experts and combine per device under shard_map (`manual.moe_shard_map`); the weights stay float32,
  as in `Buffers` (weight_einsum casts them, and their gradients, summed over the data axis, stay float32)."""

  def __call__(self, x, routing, weights):
    return manual.moe_shard_map(x, routing, weights, ACTIVATIONS[self.cfg.activation], self.output,
                                group_spec=nn.logical_to_mesh_axes(GSM), expert_spec=nn.logical_to_mesh_axes(EMH))


# moe.dispatch -> its path; all automatic (XLA places the all-to-alls) but shard_map
PATHS = Registry("moe.dispatch").add({"einsum": Buffers, "index": Buffers, "index_gather": Buffers, "grouped": Grouped,
                                "shard_map": ShardMap})


def expert_path(cfg: MoeConfig, dtype, ops: Ops | None = None, output: Callable | None = None) -> ExpertPath:
  """The path of moe.dispatch (`auto` resolved by the model's config: `platforms.resolve`), with the optional
  kernels of `ops` (None: none) and the transform of each expert's output (`ffn.output_dropout`)."""
  return PATHS[cfg.dispatch](cfg, dtype, ops or Ops(), output)

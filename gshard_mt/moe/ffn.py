"""The experts' FFN, written once for every dispatch path: act(x wi + bi) wo + bo, each expert on its own tokens,
wherever the path put them. A layout says how one matmul, one per-expert bias and the hidden activations' placement
look in its arrangement of the tokens (`up` by wi, `down` by wo):

- `BufferLayout`: capacity buffers [E, G, C, M] (the einsum and index dispatches; the manual path per device);
- `grouped.RowLayout`: rows in blocks by expert [R, M] (the grouped dispatch's grouped matmuls).

So a change to the experts themselves (a bias, a gated unit, an output dropout) is one change, in `apply_experts`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from gshard_mt.moe.axes import EGCH, EGCM
from gshard_mt.parallel.einsum import weight_einsum


@struct.dataclass
class ExpertWeights:
  """The E experts' parameters, one structure for every path (shard_map splits it as a whole)."""

  wi: jax.Array  # [E, M, H]
  wo: jax.Array  # [E, H, M]
  bi: jax.Array | None = None  # [E, H], or None: no bias
  bo: jax.Array | None = None  # [E, M], or None: no bias


PARAMS = tuple(f.name for f in dataclasses.fields(ExpertWeights))  # the MoE layer's per-expert parameters, E first


@jax.custom_vjp
def relu(x: jax.Array) -> jax.Array:
  """max(x, 0), whose backward reads its output (h > 0 where x > 0), so the hidden activations [.., H] are kept
  once for the backward pass: the next matmul keeps them anyway."""
  return jnp.maximum(x, 0)


relu.defvjp(lambda x: (relu(x), relu(x)), lambda y, g: (jnp.where(y > 0, g, 0),))


def apply_experts(x: jax.Array, weights: ExpertWeights, layout, activation: Callable,
                  output: Callable | None = None) -> jax.Array:
  """Each expert's FFN on its tokens: x [.., M] arranged as `layout` says (buffers [E, G, C, M] or rows [R, M])
  -> [.., M] in the same arrangement, in x's dtype; `output` (`output_dropout`), if any, applied to the result."""
  h = layout.up(x, weights.wi)  # [.., H]
  if weights.bi is not None:
    h = h + layout.per_expert(weights.bi).astype(h.dtype)
  h = layout.hidden(activation(h))
  y = layout.output(layout.down(h, weights.wo))  # [.., M]
  if weights.bo is not None:
    y = y + layout.per_expert(weights.bo).astype(y.dtype)
  return y if output is None else output(y)


def output_dropout(rate: float, rng: jax.Array | None) -> Callable | None:
  """moe.expert_dropout, NLLB-MoE's moe_token_dropout, on each expert's output [.., M] before the gates weigh it:
  with `rng` (training) inverted dropout at `rate`; without (evaluation) the output times (1 - rate), as NLLB-MoE
  computes it. None where rate is 0."""
  if not rate:
    return None
  if rng is None:
    return lambda y: y * jnp.asarray(1 - rate, y.dtype)
  return lambda y: jnp.where(jax.random.bernoulli(rng, 1 - rate, y.shape), y / jnp.asarray(1 - rate, y.dtype), 0)


@dataclasses.dataclass(frozen=True)
class BufferLayout:
  """Capacity buffers [E, G, C, .]: the experts' einsums (weight_einsum casts the float32 weights, whose gradients
  stay float32). The output stays E-sharded: the caller's constraint to EGCM_BY_GROUP is the E -> G all-to-all
  (G-sharded here would let XLA all-gather wo instead). constrain=False: no constraints (inside shard_map);
  model_axis: the mesh axis H is split over inside shard_map, whose partial outputs are summed."""

  constrain: bool = True
  model_axis: str | None = None

  def up(self, x: jax.Array, wi: jax.Array) -> jax.Array:
    """[E, G, C, M] x [E, M, H] -> [E, G, C, H]."""
    return weight_einsum("EGCM,EMH->EGCH", x, wi)

  def down(self, h: jax.Array, wo: jax.Array) -> jax.Array:
    """[E, G, C, H] x [E, H, M] -> [E, G, C, M]."""
    return weight_einsum("EGCH,EHM->EGCM", h, wo)

  def per_expert(self, b: jax.Array) -> jax.Array:
    """[E, Y] -> [E, 1, 1, Y]."""
    return b[:, None, None, :]

  def hidden(self, h: jax.Array) -> jax.Array:
    return nn.with_logical_constraint(h, EGCH) if self.constrain else h

  def output(self, y: jax.Array) -> jax.Array:
    if self.model_axis:  # each device summed over its H/n_m hidden units; their sum in float32 (XLA's CPU compiler
      y = jax.lax.psum(y.astype(jnp.float32), self.model_axis).astype(y.dtype)  # aborts on this bf16 all-reduce)
    return nn.with_logical_constraint(y, EGCM) if self.constrain else y

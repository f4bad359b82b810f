"""Auxiliary-loss-free load balancing (DeepSeek-V3, 2024, section 2.1.2; `moe.balance='bias'`).

Each MoE layer keeps a per-expert bias b [E] beside its parameters (the parameter 'router_bias', so that
checkpoints, resuming, evaluation, decoding and extraction all carry it with nothing added), used to choose the
experts only: the top-k of p + b, the gates p alone. No gradient reaches it (the layer stops it) and the optimizer
does not move it: after every training step it moves by b <- b + gamma * sign(mean load - load_e). The layer
writes that new value into the 'balance' collection while training, and the train step puts it in place of the
parameter (`with_updated_biases`), over whatever the optimizer did with its zero gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import traverse_util

COLLECTION = "balance"  # the training apply's mutable collection holding the new biases
NAME = "router_bias"  # the parameter, and its new value in COLLECTION, at the same path


def updated_bias(bias: jax.Array, load: jax.Array, rate: float) -> jax.Array:
  """bias [E], load [E] (any scale: the fraction of assignments per expert) -> the bias after one step: raised for
  the experts under the mean load, lowered for those above it, by `rate`."""
  return bias + rate * jnp.sign(jnp.mean(load) - load)


def biases_of(params: dict, balance: dict) -> dict:
  """The parameters at `balance`'s paths, in its structure (what `with_updated_biases` would replace)."""
  flat = traverse_util.flatten_dict(params)
  return traverse_util.unflatten_dict({path: flat[path] for path in traverse_util.flatten_dict(balance)})


def with_updated_biases(params: dict, balance: dict) -> dict:
  """`params` with each leaf of `balance` (the COLLECTION a training apply returned, mirroring the parameters'
  paths) in place of the parameter at the same path; `balance` empty: `params` unchanged."""
  if not balance:
    return params
  flat = traverse_util.flatten_dict(params)
  for path, value in traverse_util.flatten_dict(balance).items():
    flat[path] = value.astype(flat[path].dtype)
  return traverse_util.unflatten_dict(flat)

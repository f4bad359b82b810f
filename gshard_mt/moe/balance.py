"""Auxiliary-loss-free load balancing (DeepSeek-V3, 2024, section 2.1.2; `moe.balance='bias'`).

Each MoE layer keeps a per-expert bias b [E] as the parameter 'router_bias' (so checkpoints, evaluation, decoding
and extraction carry it), used to choose the experts only: the top-k of p + b, the gates p alone. No gradient
reaches it; once per training step b <- b + gamma * sign(mean load - load_e), load_e the assignments *asked* of
expert e (`Routing.requested`, before capacity: the kept load would hide the imbalance where capacity binds, an
expert asked too often being cut to C), summed over the step's groups and microbatches. The layer writes its
counts into the 'balance' collection at the bias's path; the train step sums them and puts the moved biases in
place of the parameters (`moved_biases`, `with_updated_biases`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import traverse_util

COLLECTION = "balance"  # the training apply's mutable collection holding the requested counts
NAME = "router_bias"  # the parameter, and its layer's requested counts in COLLECTION, at the same path


def updated_bias(bias: jax.Array, counts: jax.Array, rate: float) -> jax.Array:
  """bias [..., E], counts int [..., E] -> the bias after one step: +rate under the mean count, -rate above it.
  Exact: compares count_e with floor and ceil of total / E in integers (count_e * E could overflow)."""
  counts = counts.astype(jnp.int32)
  E = counts.shape[-1]
  total = counts.sum(axis=-1, keepdims=True)
  over = counts > total // E  # count_e * E > total
  under = counts < -(-total // E)  # count_e * E < total
  return bias + rate * (under.astype(bias.dtype) - over.astype(bias.dtype))


def moved_biases(params: dict, counts: dict, rate: float) -> dict:
  """The biases of `params` at the paths of `counts` (the COLLECTION of a training apply, summed over the step's
  microbatches), each moved once by its counts (`updated_bias`); in `counts`' structure."""
  return jax.tree.map(lambda bias, c: updated_bias(bias, c, rate), biases_of(params, counts), counts)


def biases_of(params: dict, balance: dict) -> dict:
  """The parameters at `balance`'s paths, in its structure (what `with_updated_biases` would replace)."""
  flat = traverse_util.flatten_dict(params)
  return traverse_util.unflatten_dict({path: flat[path] for path in traverse_util.flatten_dict(balance)})


def with_updated_biases(params: dict, balance: dict) -> dict:
  """`params` with each leaf of `balance` (new biases at the parameters' paths) in place of the parameter at the
  same path; `balance` empty or None: `params` unchanged."""
  if not balance:
    return params
  flat = traverse_util.flatten_dict(params)
  for path, value in traverse_util.flatten_dict(balance).items():
    flat[path] = value.astype(flat[path].dtype)
  return traverse_util.unflatten_dict(flat)

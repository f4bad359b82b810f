"""NLLB-MoE's MoE layer options (moe.expert_bias, moe.normalize_before_drops, moe.eval_capacity_fraction,
moe.train_capacity, moe.expert_dropout) against a plain per-token loop written as NLLB-MoE's router computes: the
top-2 of a float32 softmax, top-1 assignments placed before top-2 over the whole group, positions >= C dropped, the
kept gates renormalised, each expert's output scaled by (1 - dropout) in evaluation; and their refusals."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt import cli
from gshard_mt.config.moe import MoeConfig
from gshard_mt.moe import ffn, gating
from gshard_mt.moe.layer import MoeFeedForward

B, L, M, H, E = 3, 8, 8, 16, 4


def nllb_reference(x, mask, p, fraction, dropout):
  """x [N, M], mask [N] -> y [N, M] by a loop over tokens and experts (numpy, float64)."""
  x, N = np.asarray(x, np.float64), len(x)
  logits = x @ np.asarray(p["wg"], np.float64)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  first = probs.argmax(-1)
  second = np.where(np.eye(E, dtype=bool)[first], -np.inf, probs).argmax(-1)
  capacity = math.ceil(fraction * N)
  used = np.zeros(E, int)
  kept = np.zeros((N, 2), bool)
  for j, choice in enumerate((first, second)):  # every first choice before any second
    for n in range(N):
      if mask[n]:
        kept[n, j] = used[choice[n]] < capacity
        used[choice[n]] += 1
  y = np.zeros_like(x)
  for n in range(N):
    gates = np.array([probs[n, first[n]], probs[n, second[n]]]) * kept[n]
    gates /= max(gates.sum(), np.finfo(np.float32).eps)
    for g, e in zip(gates, (first[n], second[n])):
      if g:
        h = np.maximum(x[n] @ p["wi"][e] + p["bi"][e], 0)
        y[n] += g * (1 - dropout) * (h @ p["wo"][e] + p["bo"][e])
  return y


def nllb_layer(dispatch="index", **kw):
  options = dict(num_experts=E, hidden_dim=H, group_size=B * L, dispatch=dispatch, second_expert_policy="all",
                 expert_bias=True, normalize_before_drops=False, eval_capacity_fraction=0.25, expert_dropout=0.2)
  return MoeFeedForward(MoeConfig(**{**options, **kw}))


def random_params(layer, x, mask):
  params = nn.unbox(layer.init(jax.random.key(1), x, mask))["params"]
  keys = jax.random.split(jax.random.key(2), len(params))
  return {name: jax.random.normal(k, v.shape) * (0.5 if name.startswith("b") else 1.0)
          for k, (name, v) in zip(keys, sorted(params.items()))}


@pytest.mark.parametrize("dispatch", ["einsum", "index", "index_gather", "grouped"])
@pytest.mark.parametrize("fraction", [0.25, 1.0])
def test_layer_equals_nllb_moe_per_token(dispatch, fraction):
  x = jax.random.normal(jax.random.key(0), (B, L, M))
  mask = jnp.arange(L)[None, :] < jnp.array([8, 5, 3])[:, None]
  layer = nllb_layer(dispatch, eval_capacity_fraction=fraction)
  params = random_params(layer, x, mask)
  y, _ = layer.apply({"params": params}, x, mask, deterministic=True)
  ref = nllb_reference(x.reshape(-1, M), np.asarray(mask).reshape(-1), jax.tree.map(np.asarray, params), fraction,
                       0.2)
  np.testing.assert_allclose(np.asarray(y).reshape(-1, M), ref, atol=2e-5)
  if fraction < 1:  # the capacity bound: some token kept one expert only, and the reference weighs it by 1
    routing_kept = layer.apply({"params": params}, x, mask, deterministic=True, mutable=["routing"])[1]
    kept = np.asarray(routing_kept["routing"]["kept"]).reshape(-1, 2)[np.asarray(mask).reshape(-1)]
    assert (kept.sum(-1) == 1).any()


def test_after_drops_renormalises_what_was_kept():
  logits = jnp.log(jnp.array([[[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.2, 0.7, 0.1]]]))  # [G=1, S=3, E=3]
  before = gating.topk_gating(logits, 2, 1)
  after = gating.topk_gating(logits, 2, 1, after_drops=True)
  # C = 1: token 0 keeps expert 0, token 2 expert 1 (first choices first); token 1 keeps nothing
  np.testing.assert_array_equal(after.kept, before.kept)
  np.testing.assert_allclose(after.weight[0, :, 0], [1.0, 0.0, 1.0], rtol=1e-6)
  np.testing.assert_allclose(before.weight[0, :, 0], [0.6 / 0.9, 0.0, 0.7 / 0.9], rtol=1e-5)


def test_capacity_rules():
  layer = nllb_layer(train_capacity=3, eval_capacity_fraction=0.5)
  params = random_params(layer, jnp.ones((B, L, M)), None)
  bound = layer.bind({"params": params})
  assert bound._capacity(None, 24, deterministic=False) == 3  # whatever S
  assert bound._capacity(None, 23, deterministic=True) == 12  # ceil(0.5 * 23)
  assert gating.token_capacity(7, 0.01) == 1


def test_expert_dropout_while_training():
  y = jnp.ones((4, 64, 64))
  dropped = ffn.output_dropout(0.25, jax.random.key(0))(y)
  zeros = float(jnp.mean(dropped == 0))
  assert 0.2 < zeros < 0.3 and np.allclose(dropped[dropped != 0], 1 / 0.75)
  assert np.allclose(ffn.output_dropout(0.25, None)(y), 0.75)
  assert ffn.output_dropout(0.0, None) is None


@pytest.mark.parametrize("overrides,message", [
    ({"moe.router": "switch", "moe.normalize_before_drops": "False"}, "has none to renormalise"),
    ({"moe.router": "dropless", "moe.dispatch": "grouped", "moe.eval_capacity_fraction": "0.5"},
     "has no such capacity"),
    ({"moe.expert_dropout": "0.1", "moe.dispatch": "shard_map"}, "moe.dispatch='shard_map'"),
    ({"moe.expert_kernel": "pallas", "moe.expert_bias": "True"}, "has no biases nor output dropout"),
    ({"model.attention": "pallas", "model.bias": "True"}, "has no biases"),
    ({"model.attention": "pallas", "model.layer_norm_epsilon": "1e-5"}, "layer norm epsilon"),
])
def test_refusals(overrides, message):
  with pytest.raises(Exception, match=message) as error:
    cli.load("configs/tiny.py", overrides)
  assert "\n" not in str(error.value)

"""Bias balancing (moe.balance='bias') in the train step: the selection biases move by the sign of each expert's
load error and nothing else moves them; they live with the parameters, so checkpoints hold them."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from gshard_mt.data.packing import BATCH_KEYS
from gshard_mt.model.transformer import Transformer, TransformerConfig, dummy_batch
from gshard_mt.moe import balance
from gshard_mt.training.step import TrainState, train_step
from tests.helpers import small_config

RATE = 0.125


def _bias_step(tx, **overrides):
  """(state, batch, jitted step) of a tiny topk model balanced by bias (one MoE layer per stack, no dropout, so that
  routing depends on the parameters and tokens alone), B=4 rows of L=8 tokens."""
  B, L, V = 4, 8, 32
  config = small_config(**{"moe.group_size": 16, "moe.router": "topk", "moe.balance": "bias",
                           "moe.aux_loss_weight": 0.0, "moe.bias_update_rate": RATE, "model.emb_dim": 16,
                           "model.mlp_dim": 32, "moe.hidden_dim": 16, "data.max_length": L, "model.moe_interval": 1,
                           "model.num_encoder_layers": 1, "model.num_decoder_layers": 1, "model.dropout_rate": 0.0,
                           **overrides})
  model = Transformer(TransformerConfig.from_config(config, V), deterministic=False)
  rng = np.random.default_rng(0)
  shapes = jax.eval_shape(model.init, jax.random.key(0), dummy_batch(1, L))["params"]
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.3, s.shape), jnp.float32), nn.unbox(shapes))
  batch = batch_of(rng.integers(1, V, (B, L)))
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                     rng=jax.random.key_data(jax.random.key(1)))
  return state, batch, jax.jit(functools.partial(train_step, model=model, tx=tx, config=config))


def batch_of(tokens: np.ndarray) -> dict:
  """A batch of one pair per row, source and target both `tokens` [B, L]."""
  B, L = tokens.shape
  return {key: jnp.asarray(tokens if key in ("inputs", "targets") else np.ones((B, L), np.int32)
                           if key.endswith("segmentation") else np.arange(L)[None].repeat(B, 0))
          for key in BATCH_KEYS}


def _biases(params) -> dict:
  """{(stack, ...): [units, E]} selection biases of a parameter tree."""
  return {path: v for path, v in traverse_util.flatten_dict(params).items() if path[-1] == balance.NAME}


def test_train_step_moves_each_bias_by_the_sign_of_its_load_error():
  tx = optax.adamw(0.1, weight_decay=0.5)  # would move a parameter even with a zero gradient
  state, batch, step = _bias_step(tx)
  params = state.params
  new, metrics = step(state, batch)
  flat_old, flat_new = traverse_util.flatten_dict(params), traverse_util.flatten_dict(new.params)
  biases = list(_biases(params))
  assert [p[0] for p in biases] == ["decoder", "encoder"]  # one MoE layer per stack, scanned: [units, E]
  for path in biases:
    side = path[0]
    load = np.stack([metrics[f"moe/{side}_{u}/load"] for u in range(flat_old[path].shape[0])])
    np.testing.assert_allclose(flat_new[path] - flat_old[path], RATE * np.sign(load.mean(-1, keepdims=True) - load),
                               atol=1e-7)
  assert not np.allclose(flat_new[("embed", "embedding")], flat_old[("embed", "embedding")])  # the rest trained


def test_microbatches_move_each_bias_by_the_mean_of_their_steps():
  """With num_microbatches=2 each bias moves by the mean of the two steps that each microbatch alone would make
  from the same parameters (microbatch k holds rows k and 2 + k: `microbatches`). The rows of one microbatch repeat
  one token and those of the other another, chosen so that the two microbatches move some bias differently."""
  tx = optax.sgd(0.0)  # the biases move by their rule alone
  state, _, step = _bias_step(tx, num_microbatches=2)
  _, _, single = _bias_step(tx)
  old = _biases(state.params)

  def alone(token):  # the bias step of a microbatch whose 2 rows repeat `token` (4 rows: the same groups twice)
    new, _ = single(state, batch_of(np.full((4, 8), token)))
    return {path: v - old[path] for path, v in _biases(new.params).items()}

  a, steps = 1, {1: alone(1)}
  b = next(b for b in range(2, 32) if any(np.any(steps.setdefault(b, alone(b))[p] != steps[a][p]) for p in old))
  accumulated, _ = step(state, batch_of(np.array([[a], [b], [a], [b]]).repeat(8, axis=1)))
  for path in old:
    np.testing.assert_allclose(_biases(accumulated.params)[path] - old[path], (steps[a][path] + steps[b][path]) / 2,
                               atol=1e-7, err_msg=str(path))

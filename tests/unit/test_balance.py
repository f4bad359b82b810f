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


def test_train_step_moves_each_bias_by_the_sign_of_its_load_error():
  B, L, V = 4, 8, 32
  rate = 0.125
  config = small_config(**{"moe.group_size": 16, "moe.router": "topk", "moe.balance": "bias",
                           "moe.aux_loss_weight": 0.0, "moe.bias_update_rate": rate, "model.emb_dim": 16,
                           "model.mlp_dim": 32, "moe.hidden_dim": 16, "data.max_length": L, "model.moe_interval": 1,
                           "model.num_encoder_layers": 1, "model.num_decoder_layers": 1})
  model = Transformer(TransformerConfig.from_config(config, V), deterministic=False)
  rng = np.random.default_rng(0)
  shapes = jax.eval_shape(model.init, jax.random.key(0), dummy_batch(1, L))["params"]
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.3, s.shape), jnp.float32), nn.unbox(shapes))
  tokens = rng.integers(1, V, (B, L))
  batch = {key: jnp.asarray(tokens if key in ("inputs", "targets") else np.ones((B, L), np.int32)
                            if key.endswith("segmentation") else np.arange(L)[None].repeat(B, 0))
           for key in BATCH_KEYS}
  tx = optax.adamw(0.1, weight_decay=0.5)  # would move a parameter even with a zero gradient
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                     rng=jax.random.key_data(jax.random.key(1)))
  new, metrics = jax.jit(functools.partial(train_step, model=model, tx=tx, config=config))(state, batch)
  flat_old, flat_new = traverse_util.flatten_dict(params), traverse_util.flatten_dict(new.params)
  biases = [path for path in flat_old if path[-1] == balance.NAME]
  assert [p[0] for p in biases] == ["decoder", "encoder"]  # one MoE layer per stack, scanned: [units, E]
  for path in biases:
    side = path[0]
    load = np.stack([metrics[f"moe/{side}_{u}/load"] for u in range(flat_old[path].shape[0])])
    np.testing.assert_allclose(flat_new[path] - flat_old[path], rate * np.sign(load.mean(-1, keepdims=True) - load),
                               atol=1e-7)
  assert not np.allclose(flat_new[("embed", "embedding")], flat_old[("embed", "embedding")])  # the rest trained

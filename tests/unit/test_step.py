"""The training step's loss: cross entropy with label smoothing against a plain computation."""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.training.step import cross_entropy, microbatches


def plain_cross_entropy(logits, targets, weights, smoothing):
  """Per token: KL(smoothed target || softmax), so that a perfect prediction of the smoothed target scores 0."""
  V = logits.shape[-1]
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  loss, nll, correct = 0.0, 0.0, 0.0
  for b in range(logits.shape[0]):
    for t in range(logits.shape[1]):
      q = np.full(V, smoothing / (V - 1))
      q[targets[b, t]] = 1 - smoothing
      kl = sum(q[v] * (np.log(q[v]) - log_probs[b, t, v]) for v in range(V) if q[v] > 0)
      loss += weights[b, t] * kl
      nll += weights[b, t] * -log_probs[b, t, targets[b, t]]
      correct += weights[b, t] * (np.argmax(logits[b, t]) == targets[b, t])
  return loss, nll, correct


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_matches_a_plain_computation(smoothing, dtype):
  rng = np.random.default_rng(0)
  # bfloat16 logits (a bfloat16 model's) are read exactly: the plain computation gets the same rounded values.
  logits = np.asarray(jnp.asarray(rng.normal(size=(2, 3, 5)) * 2, dtype), np.float64)
  targets = rng.integers(0, 5, (2, 3))
  weights = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
  got = cross_entropy(jnp.asarray(logits, dtype), jnp.asarray(targets), jnp.asarray(weights), smoothing)
  np.testing.assert_allclose([float(g) for g in got], plain_cross_entropy(logits, targets, weights, smoothing),
                             rtol=1e-5, atol=1e-5)


def test_a_perfect_smoothed_prediction_scores_zero():
  V, s = 4, 0.1
  q = np.full(V, s / (V - 1))
  q[2] = 1 - s
  logits = jnp.asarray(np.log(q))[None, None]
  loss, _, _ = cross_entropy(logits, jnp.array([[2]]), jnp.ones((1, 1)), s)
  assert float(loss) == pytest.approx(0.0, abs=1e-6)


def test_microbatches_take_every_kth_row():
  rows = microbatches({"x": np.arange(12).reshape(6, 2)}, 2)["x"]
  np.testing.assert_array_equal(rows[:, :, 0], [[0, 4, 8], [2, 6, 10]])


def test_accumulated_microbatches_make_the_whole_batchs_step():
  """Two microbatches of 4 rows (MoE groups of 2 rows, capacity short enough to drop tokens, the aux loss weighted
  heavily, rows of different lengths, so the microbatches hold different numbers of real tokens) against the plain
  step on the same 8 rows in microbatch order: the same loss, token counts, aux and z losses, routing metrics
  (each expert's load, not a mean of the microbatches' shares) and update (plain SGD, so the update is the
  gradient), in float32."""
  import flax.linen as nn
  import jax
  import optax

  from gshard_mt.batch import BATCH_KEYS
  from gshard_mt.model.transformer import Transformer, TransformerConfig, dummy_batch
  from gshard_mt.training.step import TrainState, train_step
  from tests.helpers import small_config

  B, L, V = 8, 8, 32
  overrides = {"moe.group_size": 16, "moe.second_expert_policy": "all", "moe.train_capacity_factor": 0.5,
               "moe.aux_loss_weight": 0.5, "moe.z_loss_weight": 0.1, "model.emb_dim": 16, "model.mlp_dim": 32,
               "moe.hidden_dim": 16, "data.max_length": L, "model.moe_interval": 1, "model.num_encoder_layers": 1,
               "model.num_decoder_layers": 1}
  configs = {k: small_config(num_microbatches=k, **overrides) for k in (1, 2)}
  model = Transformer(TransformerConfig.from_config(configs[1], V), deterministic=False)
  rng = np.random.default_rng(0)
  shapes = jax.eval_shape(model.init, jax.random.key(0), dummy_batch(1, L))["params"]  # no compile, unlike init
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.3, s.shape), jnp.float32), nn.unbox(shapes))
  real = np.arange(L)[None] < rng.integers(2, L + 1, (B, 1))  # [B, L]: each row's first 2..L positions
  tokens = {key: rng.integers(1, V, (B, L)) * real for key in ("inputs", "targets")}
  batch = {key: jnp.asarray(tokens[key.split("_")[0]] if key in tokens else real.astype(np.int32) if
                            key.endswith("segmentation") else np.arange(L)[None].repeat(B, 0) * real)
           for key in BATCH_KEYS}
  in_order = jax.tree.map(lambda x: x.reshape(B, L), microbatches(batch, 2))
  tx = optax.sgd(1.0)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                     rng=jax.random.key_data(jax.random.key(1)))

  def step(batch, config):
    return jax.jit(functools.partial(train_step, model=model, tx=tx, config=config))(state, batch)

  plain, plain_metrics = step(in_order, configs[1])
  accumulated, metrics = step(batch, configs[2])
  halves = [(batch["targets_segmentation"][k::2] > 0).sum() for k in (0, 1)]
  assert halves[0] != halves[1], halves  # else a mean of the microbatches' means would pass too
  moe_keys = [key for key in plain_metrics if key.startswith("moe/")]
  assert "moe/decoder_0/load" in moe_keys and "moe/encoder_0/requested_load" in moe_keys
  for key in ("loss", "nll", "accuracy", "aux_loss", "z_loss", "target_tokens", "source_tokens", "grad_norm",
              *moe_keys):
    np.testing.assert_allclose(metrics[key], plain_metrics[key], rtol=2e-6, atol=1e-7, err_msg=key)
  assert 0 < float(metrics["moe/encoder_0/top1_dropped"]) and float(metrics["aux_loss"]) > 1.0
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), accumulated.params, plain.params)

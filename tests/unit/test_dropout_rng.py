"""model.dropout_rng: the dropout masks' bits from XLA's RngBitGenerator ('rbg') or threefry, both made from the
step's threefry key. Deterministic steps, exact resumption, the masks' density, and a config that names the key."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt import cli
from gshard_mt.batch import BATCH_KEYS
from gshard_mt.errors import ConfigError
from gshard_mt.model.layers import DROPOUT_KEYS
from gshard_mt.model.transformer import Transformer, TransformerConfig, dummy_batch
from gshard_mt.training.setup import build
from tests.helpers import ROOT, small_config

V = 64


def batch(seed: int, rows: int, length: int) -> dict:
  """Full rows of one pair each, random tokens."""
  rng = np.random.default_rng(seed)
  ones = np.ones((rows, length), np.int32)
  return {key: rng.integers(1, V, (rows, length)).astype(np.int32) if key in ("inputs", "targets") else
          np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)) if key.endswith("_position") else ones
          for key in BATCH_KEYS}


def two_steps(dropout_rng: str):
  """(state after one step as the host holds it, as a checkpoint does; the state after two steps) of configs/tiny.py
  shrunk, with dropout 0.1 and the given generator."""
  config = small_config(**{"model.dropout_rate": 0.1, "model.dropout_rng": dropout_rng})
  setup = build(config, V)
  step = setup.jit_train_step(Transformer(setup.model_cfg, deterministic=False), config)
  b1, b2 = (batch(seed, config.batch_size, config.data.max_length) for seed in (1, 2))
  first = jax.device_get(step(setup.init_state(config.seed), b1)[0])
  resumed = jax.device_put(first, setup.state_shardings)  # what restoring a checkpoint gives
  return first, jax.device_get(step(resumed, b2)[0])


def assert_equal(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_rbg_steps_are_deterministic_and_resume_exactly():
  """The same state and batches give bit-equal states; the second step from a host copy of the first (a resumed
  run) equals it too, and the checkpointed key keeps threefry's shape, so older checkpoints restore."""
  first, second = two_steps("rbg")
  again_first, again_second = two_steps("rbg")
  assert_equal(first, again_first)
  assert_equal(second, again_second)
  assert first.rng.shape == (2,) and first.rng.dtype == np.uint32
  _, threefry = two_steps("threefry")  # the option is in effect: other masks, another update
  assert not np.array_equal(threefry.params["logits"], second.params["logits"])


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_rbg_masks_keep_one_minus_the_rate(rate):
  n = 1 << 20
  key = DROPOUT_KEYS["rbg"](jax.random.key(0))
  kept = nn.Dropout(rate).apply({}, jnp.ones(n), deterministic=False, rngs={"dropout": key})
  assert set(np.unique(kept).tolist()) == {0.0, np.float32(1 / (1 - rate))}
  assert abs(float((kept > 0).mean()) - (1 - rate)) < 6 * np.sqrt(rate * (1 - rate) / n)  # 6 sigma, binomial


def residual_masks(step: int) -> list[np.ndarray]:
  """The kept positions of the self-attention residual's dropout in each encoder layer ([B, L, M] each), with the
  dropout key of `step` made as the training step makes it."""
  cfg = TransformerConfig.reference(vocab_size=V, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64,
                                    num_encoder_layers=3, num_decoder_layers=1, moe_interval=0, dropout_rate=0.5,
                                    scan_layers=False)
  model = Transformer(cfg, deterministic=False)
  data = batch(0, 4, 16)
  params = model.init(jax.random.key(0), dummy_batch(1, 8))
  dropout_key, _ = jax.random.split(jax.random.fold_in(jax.random.key(1), step))
  _, state = model.apply(params, data, rngs={"dropout": DROPOUT_KEYS["rbg"](dropout_key)},
                         capture_intermediates=lambda module, _: isinstance(module, nn.Dropout))
  encoder = state["intermediates"]["encoder"]
  return [np.asarray(encoder[f"unit_{u}"]["layer_0"]["Dropout_0"]["__call__"][0] != 0) for u in range(3)]


def test_rbg_masks_differ_across_steps_and_layers():
  masks = residual_masks(0) + residual_masks(1)
  for i in range(len(masks)):
    assert abs(masks[i].mean() - 0.5) < 0.05
    for j in range(i):
      assert 0.4 < (masks[i] == masks[j]).mean() < 0.6, (i, j)  # independent halves agree half the time


def test_an_unknown_generator_is_one_line_naming_the_key():
  with pytest.raises(ConfigError) as raised:
    cli.load(ROOT / "configs" / "tiny.py", {"model.dropout_rng": "philox"})
  assert str(raised.value) == "model.dropout_rng='philox': expected one of ('auto', 'threefry', 'rbg')"


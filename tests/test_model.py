"""Model pieces: the initial loss at any width, attention bias, shift right."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt import model as model_lib
from gshard_mt.model import Transformer, TransformerConfig, dummy_batch

V = 1000


def initial_nll(emb_dim: int, embedding: str, tied_logits: bool = False) -> float:
  """Mean next-token NLL of a freshly initialised model on random tokens."""
  cfg = TransformerConfig(vocab_size=V, emb_dim=emb_dim, num_heads=2, head_dim=16, mlp_dim=64, num_encoder_layers=2,
                          num_decoder_layers=2, moe_interval=0, dropout_rate=0.0, embedding=embedding,
                          tied_logits=tied_logits)
  rng = np.random.default_rng(0)
  batch = {k: np.array(v) for k, v in dummy_batch(4, 16).items()}
  batch["inputs"] = rng.integers(3, V, (4, 16)).astype(np.int32)
  batch["targets"] = rng.integers(3, V, (4, 16)).astype(np.int32)
  model = Transformer(cfg)
  params = jax.jit(model.init)(jax.random.key(0), batch)
  logits, _ = jax.jit(model.apply)(params, batch)
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], -1)
  return float(nll.mean())


@pytest.mark.parametrize("embedding", ["vaswani", "t5"])
@pytest.mark.parametrize("emb_dim", [32, 256, 1024])
def test_initial_loss_is_near_uniform_at_any_width(emb_dim, embedding):
  assert abs(initial_nll(emb_dim, embedding) - np.log(V)) < 1.0


@pytest.mark.parametrize("embedding", ["sqrt_input", "vaswani"])
def test_tied_logits_start_far_above_uniform_at_large_width(embedding):
  """Through a tied output embedding the decoder's input token, which dominates the residual stream at
  initialisation, gets a logit growing like sqrt(M): why tied_logits is off by default."""
  assert initial_nll(1024, embedding, tied_logits=True) > np.log(V) + 5


def test_every_scheme_is_a_config_choice():
  from gshard_mt import config

  assert set(config.CHOICES["model.embedding"]) == set(model_lib.EMBEDDING_SCHEMES)


def test_attention_bias_masks_other_segments_padding_and_the_future():
  segments = jnp.array([[1, 1, 2, 0]])
  bias = np.asarray(model_lib.attention_bias(segments, segments, causal=True))[0, 0]
  allowed = bias == 0
  expected = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], bool)
  np.testing.assert_array_equal(allowed, expected)
  assert (bias[~allowed] == model_lib.NEG_INF).all()
  full = np.asarray(model_lib.attention_bias(segments, segments, causal=False))[0, 0] == 0
  np.testing.assert_array_equal(full, np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], bool))


def test_shift_right_starts_each_packed_pair_from_pad():
  targets = jnp.array([[5, 6, 7, 8, 9, 0]])
  segments = jnp.array([[1, 1, 1, 2, 2, 0]])
  np.testing.assert_array_equal(model_lib.shift_right(targets, segments), [[0, 5, 6, 0, 8, 0]])

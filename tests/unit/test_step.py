"""The training step's loss: cross entropy with label smoothing against a plain computation."""

import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.training.step import cross_entropy


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

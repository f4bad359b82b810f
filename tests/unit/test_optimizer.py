"""The learning-rate schedules and the two optimizers, against hand-computed values."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gshard_mt.training.optimizer import learning_rate_schedule, make_optimizer


def opt_config(**kw):
  values = dict(name="adam", learning_rate=0.5, schedule="rsqrt", warmup_steps=100, grad_clip_norm=1.0,
                weight_decay=0.0)
  return types.SimpleNamespace(**{**values, **kw})


@pytest.mark.parametrize("schedule, expected", [
    # step 0 counts as step 1; linear warmup to the peak at step 100, then peak * sqrt(100 / step)
    ("rsqrt", {0: 0.005, 1: 0.005, 50: 0.25, 100: 0.5, 400: 0.25, 10_000: 0.05}),
    ("constant", {0: 0.005, 50: 0.25, 100: 0.5, 400: 0.5, 10_000: 0.5}),
])
def test_learning_rate_schedule(schedule, expected):
  lr = learning_rate_schedule(opt_config(schedule=schedule))
  for step, value in expected.items():
    assert float(lr(jnp.asarray(step))) == pytest.approx(value, rel=1e-6), step


def test_adam_first_update_is_minus_lr_times_the_gradient_sign():
  tx = make_optimizer(opt_config(warmup_steps=1))
  params = {"w": jnp.array([1.0, -2.0, 3.0])}
  grads = {"w": jnp.array([0.3, -0.01, 0.0])}
  updates, _ = tx.update(grads, tx.init(params), params)
  np.testing.assert_allclose(updates["w"], [-0.5, 0.5, 0.0], atol=1e-4)  # Adam's first step: m / sqrt(v) = sign


def test_adam_weight_decay_is_decoupled():
  tx = make_optimizer(opt_config(warmup_steps=1, weight_decay=0.1))
  params = {"w": jnp.array([2.0])}
  updates, _ = tx.update({"w": jnp.array([0.0])}, tx.init(params), params)
  np.testing.assert_allclose(updates["w"], [-0.5 * 0.1 * 2.0], rtol=1e-5)  # -lr * wd * w with a zero gradient


def adam_state(state):
  return next(s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
              if isinstance(s, optax.ScaleByAdamState))


def test_gradients_are_clipped_to_the_global_norm():
  # Adam's update is invariant to the gradient's scale, its second moment is not: nu = (1 - b2) g^2 after one step,
  # with g the clipped gradient.
  tx = make_optimizer(opt_config(grad_clip_norm=2.0))
  params = {"w": jnp.ones((4,))}
  g = jnp.array([30.0, -40.0, 0.0, 0.0])  # norm 50: clipped to norm 2
  _, state = tx.update({"w": g}, tx.init(params), params)
  np.testing.assert_allclose(adam_state(state).nu["w"], 0.02 * (g * 2 / 50) ** 2, rtol=1e-5)
  _, state = tx.update({"w": g / 100}, tx.init(params), params)  # norm 0.5, under the limit: unchanged
  np.testing.assert_allclose(adam_state(state).nu["w"], 0.02 * (g / 100) ** 2, rtol=1e-5)


def test_adafactor_keeps_factored_second_moments_and_no_first_moment():
  tx = make_optimizer(opt_config(name="adafactor"))
  state = tx.init({"w": jnp.zeros((256, 128)), "b": jnp.zeros((128,))})
  factored = [s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optax.FactoredState))
              if isinstance(s, optax.FactoredState)]
  assert len(factored) == 1
  # optax's factoring: the row statistic drops the largest dimension, the column one the second largest
  assert factored[0].v_row["w"].shape == (128,) and factored[0].v_col["w"].shape == (256,)
  assert factored[0].v["b"].shape == (128,)  # too small to factor: a full second moment
  with pytest.raises(StopIteration):
    adam_state(state)

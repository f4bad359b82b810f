"""The learning-rate schedules and the two optimizers, against hand-computed values and a plain NumPy Adafactor."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gshard_mt import cli
from gshard_mt.training.optimizer import ADAFACTOR, make_optimizer, schedule_step
from gshard_mt.training.schedules import schedule_of
from gshard_mt.training.step import TrainState, apply_update
from tests.helpers import ROOT


def opt_config(**kw):
  values = dict(name="adam", learning_rate=0.5, schedule="rsqrt", warmup="linear", warmup_steps=100,
                grad_clip_norm=1.0, weight_decay=0.0, kernel="xla")
  return types.SimpleNamespace(**{**values, **kw})


@pytest.mark.parametrize("schedule, warmup, expected", [
    # step 0 counts as step 1; linear warmup to the peak at step 100, then peak * sqrt(100 / step)
    ("rsqrt", "linear", {0: 0.005, 1: 0.005, 50: 0.25, 100: 0.5, 400: 0.25, 10_000: 0.05}),
    ("constant", "linear", {0: 0.005, 50: 0.25, 100: 0.5, 400: 0.5, 10_000: 0.5}),
    # held at the peak through warmup (GShard's): 0.5 x sqrt(100 / max(step, 100))
    ("rsqrt", "constant", {0: 0.5, 1: 0.5, 50: 0.5, 100: 0.5, 400: 0.25, 10_000: 0.05}),
    ("constant", "constant", {0: 0.5, 400: 0.5}),
])
def test_learning_rate_schedules(schedule, warmup, expected):
  lr = schedule_of(opt_config(schedule=schedule, warmup=warmup), 1000)
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


def test_no_global_norm_clipping_at_zero():
  tx = make_optimizer(opt_config(grad_clip_norm=0.0))
  params = {"w": jnp.ones((4,))}
  g = jnp.array([30.0, -40.0, 0.0, 0.0])
  _, state = tx.update({"w": g}, tx.init(params), params)
  np.testing.assert_allclose(adam_state(state).nu["w"], 0.02 * g ** 2, rtol=1e-5)  # the gradient as it came
  clipped = make_optimizer(opt_config(grad_clip_norm=2.0))
  assert jax.tree.structure(state) == jax.tree.structure(clipped.init(params))  # checkpoints restore either way


def reference_adafactor(x, grads, lrs):
  """Shazeer and Stern 2018, Algorithm 4 (factored, for a matrix) and 5 (a vector) with beta1 = 0, relative step
  sizes (epsilon2 = 1e-3), update clipping d = 1, beta2_t = 1 - t^-0.8 and epsilon1 = 1e-30, written from the paper
  in float64: the row and column sums R, C give V = R C / (1^T R). Returns each step's update."""
  x = np.asarray(x, np.float64)
  r = c = v = 0.0
  out = []
  for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
    g = np.asarray(g, np.float64)
    beta2 = 1.0 - t ** -0.8
    g2 = g ** 2 + 1e-30
    if x.ndim == 2:
      r = beta2 * r + (1 - beta2) * g2.sum(axis=1)
      c = beta2 * c + (1 - beta2) * g2.sum(axis=0)
      v_hat = np.outer(r, c) / r.sum()
    else:
      v = v_hat = beta2 * v + (1 - beta2) * g2
    u = g / np.sqrt(v_hat)
    u = u / max(1.0, np.sqrt(np.mean(u ** 2)) / 1.0)
    out.append(-lr * max(1e-3, np.sqrt(np.mean(x ** 2))) * u)
    x = x + out[-1]
  return out


@pytest.mark.parametrize("shape", [(160, 128), (96,)])  # factored (both dims >= 128), and a full second moment
def test_adafactor_follows_the_adafactor_paper(shape):
  rng = np.random.default_rng(0)
  x0 = rng.normal(0, 0.05, shape).astype(np.float32)
  # Step 2's gradient is 100x step 1's: V lags behind, G / sqrt(V) has an RMS near 1 / sqrt(1 - beta2_2) = 1.32 and
  # update clipping acts; step 3 is an ordinary one.
  grads = [rng.normal(0, 1e-3, shape), rng.normal(0, 0.1, shape), rng.normal(0, 1e-2, shape)]
  grads = [g.astype(np.float32) for g in grads]
  tx = make_optimizer(opt_config(name="adafactor", learning_rate=0.01, warmup="constant", warmup_steps=1,
                                 grad_clip_norm=0.0))
  lrs = [0.01, 0.01, 0.01 / np.sqrt(2)]  # optax counts steps from 0; the schedule counts step 0 as step 1
  params, ours = {"w": jnp.asarray(x0)}, []
  state = tx.init(params)
  for g in grads:
    updates, state = tx.update({"w": jnp.asarray(g)}, state, params)
    params = optax.apply_updates(params, updates)
    ours.append(np.asarray(updates["w"]))
  expected = reference_adafactor(x0, grads, lrs)
  for step, (a, b) in enumerate(zip(ours, expected)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-12, err_msg=f"step {step}")
  x1 = x0 + expected[0]
  clipped_rms = np.sqrt(np.mean(ours[1] ** 2)) / (lrs[1] * np.sqrt(np.mean(x1 ** 2)))
  assert clipped_rms == pytest.approx(1.0, rel=1e-4)  # step 2 moved exactly lr x RMS(x) x d: clipped


def test_adafactor_settings_are_the_papers():
  """Each of optax.adafactor's settings is given, none left to optax's defaults."""
  import inspect

  assert ADAFACTOR == dict(factored=True, min_dim_size_to_factor=128, decay_rate=0.8, clipping_threshold=1.0,
                           multiply_by_parameter_scale=True, momentum=None, eps=1e-30)
  given = set(ADAFACTOR) | {"learning_rate", "weight_decay_rate"}
  left = set(inspect.signature(optax.adafactor).parameters) - given
  assert left <= {"decay_offset", "dtype_momentum", "weight_decay_mask"}, left  # unused with these settings


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


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adafactor_equals_clip_then_optax_adafactor(weight_decay):
  """make_optimizer's Adafactor (its own RMS(X) link) against optax.clip_by_global_norm then optax.adafactor, over
  steps whose gradients are clipped (norm 40x the limit) and not: the same updates and state, factored leaves with
  the largest dim last and first, a 3-D one and a vector."""
  config = opt_config(name="adafactor", learning_rate=0.01, warmup="constant", warmup_steps=1, grad_clip_norm=1.0,
                      weight_decay=weight_decay)
  ours = make_optimizer(config)
  theirs = optax.chain(optax.clip_by_global_norm(1.0), optax.adafactor(
      schedule_of(config, 1000), weight_decay_rate=weight_decay or None, **ADAFACTOR))
  shapes = {"last": (130, 160), "first": (200, 3, 140), "deep": (4, 130, 200), "vector": (96,)}
  keys = iter(jax.random.split(jax.random.key(0), 20))
  params = {k: 0.05 * jax.random.normal(next(keys), s) for k, s in shapes.items()}
  unclipped = make_optimizer(opt_config(**{**vars(config), "grad_clip_norm": 0.0}))
  for tx in (ours, unclipped):  # checkpoints restore, from optax's chain and across the clipping setting
    assert jax.tree.structure(tx.init(params)) == jax.tree.structure(theirs.init(params))
  state_ours = state_theirs = ours.init(params)
  p_ours = p_theirs = params
  for scale in (0.1, 0.001, 0.3):  # global norms about 40, 0.4, 120
    grads = {k: scale * jax.random.normal(next(keys), s) for k, s in shapes.items()}
    u_ours, state_ours = ours.update(grads, state_ours, p_ours)
    u_theirs, state_theirs = theirs.update(grads, state_theirs, p_theirs)
    for a, b in zip(jax.tree.leaves((u_ours, state_ours)), jax.tree.leaves((u_theirs, state_theirs))):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-9)  # updates are 1e-6 to 1e-3
    p_ours, p_theirs = optax.apply_updates(p_ours, u_ours), optax.apply_updates(p_theirs, u_theirs)
  factored = [s for s in jax.tree.leaves(state_ours, is_leaf=lambda x: isinstance(x, optax.FactoredState))
              if isinstance(s, optax.FactoredState)]
  assert factored[0].v_row["first"].shape == (3, 140) and factored[0].v_col["first"].shape == (200, 3)


def test_the_paper_configs_rate_is_gshards_rsqrt_of_max_step_and_10k():
  """Lingvo's SqrtDecay of the paper, 1.0 x rsqrt(max(t, 10k)): 0.01 held for 10k steps, then 1 / sqrt(t)."""
  config = cli.load(ROOT / "configs" / "moe_128e_12l.py")
  lr = schedule_of(config.optimizer, config.num_train_steps)
  for step in (0, 1, 5_000, 10_000, 40_000, 1_000_000):
    assert float(lr(jnp.asarray(step))) == pytest.approx(max(step, 10_000) ** -0.5, rel=1e-6), step


@pytest.mark.parametrize("name", ["adafactor", "adam"])
def test_a_skipped_update_pauses_the_schedule_and_the_rate_logged_is_the_one_used(name):
  """A non-finite step keeps the optimizer state, its count included: the schedule's step falls behind the train
  step by the updates skipped, and the step's logged rate is read at the schedule's step."""
  tx = make_optimizer(opt_config(name=name, warmup_steps=10))
  params = {"w": jnp.ones((4, 3))}
  state = TrainState(step=jnp.asarray(0), params=params, opt_state=tx.init(params), rng=jnp.zeros(2, jnp.uint32))
  for finite in (False, False, True):
    used = schedule_step(state.opt_state, state.step)
    state, _, _ = apply_update(state, {"w": jnp.full((4, 3), 0.1)}, tx, jnp.asarray(finite))
  assert int(state.step) == 3 and int(used) == 0 and int(schedule_step(state.opt_state, state.step)) == 1
  assert int(schedule_step(optax.adam(1e-3).init(params), jnp.asarray(7))) == 7  # no schedule: the train step

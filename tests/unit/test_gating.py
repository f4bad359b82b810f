"""top2_gating against a plain, sequential, per-token NumPy implementation of GShard's Algorithm 1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.moe import gating


def reference_top2_gating(logits, C, policy="all", threshold=0.5, uniform=None, valid=None):
  """One token at a time, one group at a time: returns (combine [G,S,E,C], dispatch [G,S,E,C], aux)."""
  G, S, E = logits.shape
  valid = np.ones((G, S), bool) if valid is None else valid
  combine = np.zeros((G, S, E, C), np.float32)
  dispatch = np.zeros((G, S, E, C), bool)
  aux_per_group = []
  for g in range(G):
    x = logits[g].astype(np.float32)
    ex = np.exp(x - x.max(axis=-1, keepdims=True))
    gates = ex / ex.sum(axis=-1, keepdims=True)
    choices = []
    for s in range(S):
      order = [int(np.argmax(gates[s]))]
      rest = gates[s].copy()
      rest[order[0]] = -1.0
      order.append(int(np.argmax(rest)))
      g1, g2 = gates[s, order[0]], gates[s, order[1]]
      denom = g1 + g2 + 1e-9
      choices.append((order[0], g1 / denom, order[1], g2 / denom))
    n = max(int(valid[g].sum()), 1)
    density = np.zeros(E)
    proxy = np.zeros(E)
    for s in range(S):
      if valid[g, s]:
        density[choices[s][0]] += 1.0 / n
        proxy += gates[s] / n
    aux_per_group.append(np.mean(density * proxy))
    used = np.zeros(E, int)  # top-1 positions count every earlier top-1 token, overflowing ones too
    kept1 = np.zeros(E, int)
    for s in range(S):
      if not valid[g, s]:
        continue
      e1, g1 = choices[s][0], choices[s][1]
      pos, used[e1] = used[e1], used[e1] + 1
      if pos < C:
        combine[g, s, e1, pos] = g1
        dispatch[g, s, e1, pos] = True
        kept1[e1] += 1
    used2 = kept1.copy()
    for s in range(S):
      if not valid[g, s]:
        continue
      e2, g2 = choices[s][2], choices[s][3]
      if policy == "random" and not uniform[g, s] < g2 / threshold:
        continue
      pos, used2[e2] = used2[e2], used2[e2] + 1
      if pos < C:
        combine[g, s, e2, pos] = g2
        dispatch[g, s, e2, pos] = True
  return combine, dispatch, float(np.mean(aux_per_group) * E * E)


def jit_gating(logits, C, padding_mask=None, rng=None, **kw):
  """top2_gating compiled once (eager mode compiles every op separately), with its dense tensors."""
  def run(logits, padding_mask, rng):
    r = gating.top2_gating(logits, C, rng=rng, padding_mask=padding_mask, **kw)
    return r, r.combine_weights, r.dispatch_mask
  return jax.jit(run)(logits, padding_mask, rng)


CASES = [
    # G, S, E, C, policy, padded fraction, logit scale
    (1, 8, 2, 4, "all", 0.0, 1.0),
    (2, 16, 4, 4, "all", 0.0, 1.0),
    (3, 32, 8, 2, "all", 0.0, 3.0),  # heavy overflow
    (2, 32, 8, 64, "all", 0.0, 1.0),  # never overflows
    (4, 24, 16, 3, "all", 0.3, 2.0),
    (2, 64, 64, 4, "all", 0.1, 1.0),
    (3, 40, 5, 7, "random", 0.0, 1.0),
    (2, 48, 32, 2, "random", 0.25, 4.0),
    (5, 16, 3, 1, "all", 0.5, 1.0),
    (2, 128, 64, 8, "random", 0.0, 0.5),
]


@pytest.mark.parametrize("G,S,E,C,policy,pad,scale", CASES)
def test_matches_sequential_reference(G, S, E, C, policy, pad, scale):
  rng = np.random.default_rng(G * 1000 + S * 10 + E)
  logits = (rng.normal(size=(G, S, E)) * scale).astype(np.float32)
  valid = rng.uniform(size=(G, S)) >= pad
  key = jax.random.key(E)
  uniform = np.asarray(jax.random.uniform(key, (G, S)))
  out, out_combine, out_dispatch = jit_gating(jnp.asarray(logits), C, jnp.asarray(valid), key,
                                              second_expert_policy=policy)
  combine, dispatch, aux = reference_top2_gating(logits, C, policy, 0.5, uniform, valid)
  np.testing.assert_array_equal(np.asarray(out_dispatch), dispatch)
  np.testing.assert_allclose(np.asarray(out_combine), combine, atol=1e-6)
  np.testing.assert_allclose(float(out.aux_loss), aux, rtol=1e-5)
  assert out_combine.shape == (G, S, E, C) and out_combine.dtype == jnp.float32
  assert out_dispatch.dtype == jnp.bool_


@pytest.mark.parametrize("G,S,E,C,policy,pad,scale", CASES[:6])
def test_capacity_never_exceeded_and_padding_not_dispatched(G, S, E, C, policy, pad, scale):
  rng = np.random.default_rng(7)
  logits = jnp.asarray(rng.normal(size=(G, S, E)) * scale, jnp.float32)
  valid = jnp.asarray(rng.uniform(size=(G, S)) >= pad)
  mask = np.asarray(jit_gating(logits, C, valid)[2])
  assert mask.sum(axis=1).max() <= 1  # each slot holds at most one token
  assert (mask.sum(axis=(1, 3)) <= C).all()
  assert not mask[~np.asarray(valid)].any()
  assert (mask.sum(axis=(2, 3)) <= 2).all()


def test_balanced_router_gives_aux_loss_one():
  G, S, E = 2, 32, 8
  uniform = jit_gating(jnp.zeros((G, S, E)), 8)[0]
  np.testing.assert_allclose(float(uniform.aux_loss), 1.0, rtol=1e-6)
  # Each expert the first choice of exactly S/E tokens, with symmetric gates.
  cyclic = 5.0 * jax.nn.one_hot(jnp.arange(S) % E, E)[None].repeat(G, axis=0)
  np.testing.assert_allclose(float(jit_gating(cyclic, 8)[0].aux_loss), 1.0, rtol=1e-6)
  # A collapsed router is penalised.
  collapsed = 5.0 * jax.nn.one_hot(jnp.zeros((G, S), int), E)
  assert float(jit_gating(collapsed, 8)[0].aux_loss) > 3.0


@pytest.mark.parametrize("threshold", [0.5, 0.2])
def test_random_policy_keeps_second_with_probability_g2_over_threshold(threshold):
  G, S = 16, 512
  g2_levels = np.array([0.05, 0.1, 0.2, 0.3, 0.45])
  g2 = np.tile(g2_levels, G * S // len(g2_levels) + 1)[: G * S].reshape(G, S)
  logits = np.full((G, S, 4), -30.0, np.float32)
  logits[..., 0] = np.log(1 - g2)
  logits[..., 1] = np.log(g2)
  out = jit_gating(jnp.asarray(logits), S, rng=jax.random.key(0), second_expert_policy="random",
                   second_expert_threshold=threshold)[0]
  kept2 = np.asarray(out.kept[..., 1])
  for level in g2_levels:
    sel = np.isclose(g2, level)
    p = min(1.0, level / threshold)
    n = sel.sum()
    tolerance = 4 * np.sqrt(p * (1 - p) / n) + 1e-9
    assert abs(kept2[sel].mean() - p) <= tolerance, (level, kept2[sel].mean(), p)
  assert np.asarray(out.kept[..., 0]).all()


def test_random_second_choice_dropped_consumes_no_capacity():
  # Every token: e1 = 0, e2 = 1 with g2 tiny, so the random policy drops nearly all second choices; the few
  # survivors must take slots 0, 1, ... of expert 1 (nothing left behind by the dropped ones).
  S = 64
  logits = np.zeros((1, S, 3), np.float32)
  logits[..., 0] = 5.0
  logits[..., 1] = 2.0
  logits[..., 2] = -10.0
  out = jit_gating(jnp.asarray(logits), 4, rng=jax.random.key(3), second_expert_policy="random")[0]
  kept2 = np.asarray(out.kept[0, :, 1])
  assert 0 < kept2.sum() < S
  np.testing.assert_array_equal(np.asarray(out.slot[0, kept2, 1]), np.arange(min(kept2.sum(), 4)))


def test_metrics_and_z_loss():
  G, S, E, C = 2, 16, 4, 2
  logits = jax.random.normal(jax.random.key(1), (G, S, E)) * 3
  valid = jnp.arange(S)[None, :].repeat(G, 0) < 12
  out = jit_gating(logits, C, valid)[0]
  m = {k: np.asarray(v) for k, v in out.metrics.items()}
  kept = np.asarray(out.kept)
  v = np.asarray(valid)
  first, later = gating.dropped_fractions(out.metrics)
  np.testing.assert_allclose(first, 1 - kept[..., 0][v].mean(), rtol=1e-6)
  np.testing.assert_allclose(later, 1 - kept[..., 1][v].mean(), rtol=1e-6)
  np.testing.assert_array_equal(m["choices_wanted"], [v.sum(), v.sum()])
  np.testing.assert_array_equal(m["choices_dropped"], [(~kept[..., 0])[v].sum(), (~kept[..., 1])[v].sum()])
  np.testing.assert_allclose(m["unrouted"], (~kept.any(-1))[v].mean(), rtol=1e-6)
  np.testing.assert_allclose(m["expert_load"].sum(), 1.0, rtol=1e-6)
  assert m["expert_load"].shape == (E,)
  lse = np.log(np.exp(np.asarray(logits, np.float64)).sum(-1))
  np.testing.assert_allclose(float(out.z_loss), (lse[v] ** 2).mean(), rtol=1e-5)
  assert 0 < m["router_entropy"] < np.log(E)


def test_expert_capacity():
  assert gating.expert_capacity(256, 32, 1.25) == 20
  assert gating.expert_capacity(1024, 32, 1.0) == 64  # the paper's 2N/E
  assert gating.expert_capacity(16, 32, 1.0) == 4  # min_capacity
  assert gating.expert_capacity(16, 32, 1.0, min_capacity=1) == 1
  assert gating.expert_capacity(160, 32, 1.1) == 11
  assert gating.expert_capacity(100, 3, 1.0) == 67


def test_token_capacity_is_ceil_of_fraction_times_s():
  assert gating.token_capacity(100, 0.07) == 7  # 0.07 * 100 = 7.000000000000001 in floats: not 8
  assert gating.token_capacity(30, 0.1) == 3
  assert gating.token_capacity(100, 0.071) == 8
  assert gating.token_capacity(10, 0.01) == 1  # at least one slot


def test_cap_logits():
  x = jnp.linspace(-100, 100, 11)
  assert float(jnp.abs(gating.cap_logits(x, 5.0)).max()) <= 5.0
  np.testing.assert_array_equal(gating.cap_logits(x, 0.0), x)


@pytest.mark.parametrize("call, message", [
    (lambda: gating.top2_gating(jnp.zeros((4, 8)), 4), "rank 3"),
    (lambda: gating.top2_gating(jnp.zeros((1, 4, 1)), 4), "at least 2 experts"),
    (lambda: gating.top2_gating(jnp.zeros((1, 4, 4)), 2.5), "expert_capacity must be a positive integer"),
    (lambda: gating.top2_gating(jnp.zeros((1, 4, 4)), 0), "expert_capacity must be a positive integer"),
    (lambda: gating.top2_gating(jnp.zeros((1, 4, 4)), True), "expert_capacity must be a positive integer"),
    (lambda: gating.top2_gating(jnp.zeros((1, 4, 4)), 4, second_expert_policy="sampled"), "unknown second_expert"),
    (lambda: gating.top2_gating(jnp.zeros((1, 4, 4)), 4, second_expert_policy="random"), "needs an rng"),
    (lambda: gating.top2_gating(jnp.zeros((1, 4, 4)), 4, padding_mask=jnp.ones((4,))), "padding_mask"),
    (lambda: gating.expert_capacity(0, 4, 1.0), "group_size"),
    (lambda: gating.expert_capacity(8, 4, 0.0), "capacity_factor"),
])
def test_bad_input_errors(call, message):
  with pytest.raises(ValueError, match=message):
    call()


def test_merged_metrics_of_two_halves_are_the_whole_batchs():
  """Routing two halves of the groups apart and merging their metrics (`merge_metrics`, the microbatches of a step)
  gives the metrics of routing all the groups at once, although the halves hold different numbers of real tokens."""
  G, S, E, C = 4, 16, 4, 3
  logits = jax.random.normal(jax.random.key(2), (G, S, E)) * 3
  valid = jnp.arange(S)[None, :] < jnp.array([16, 3, 12, 5])[:, None]
  whole = jit_gating(logits, C, valid)[0].metrics
  halves = [jit_gating(logits[k::2], C, valid[k::2])[0].metrics for k in (0, 1)]
  assert float(halves[0]["real_tokens"]) != float(halves[1]["real_tokens"])
  merged = gating.merge_metrics(jax.tree.map(lambda *x: jnp.stack(x), *halves))
  assert merged.keys() == whole.keys()
  for name in whole:
    np.testing.assert_allclose(merged[name], whole[name], rtol=1e-6, atol=1e-7, err_msg=name)

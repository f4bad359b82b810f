"""Bias balancing (moe.balance='bias'): the selection biases move once per step by the sign of each expert's error
in the load the router asked for (before capacity, padding left out, over all groups and microbatches), exactly,
and nothing else moves them; they live with the parameters, so checkpoints hold them."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from gshard_mt.batch import BATCH_KEYS
from gshard_mt.model.transformer import Transformer, TransformerConfig, dummy_batch
from gshard_mt.moe import balance, routers
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


def test_train_step_moves_each_bias_by_the_sign_of_its_requested_load_error():
  tx = optax.adamw(0.1, weight_decay=0.5)  # would move a parameter even with a zero gradient
  state, batch, step = _bias_step(tx)
  params = state.params
  new, metrics = step(state, batch)
  flat_old, flat_new = traverse_util.flatten_dict(params), traverse_util.flatten_dict(new.params)
  biases = list(_biases(params))
  assert [p[0] for p in biases] == ["decoder", "encoder"]  # one MoE layer per stack, scanned: [units, E]
  for path in biases:
    side = path[0]
    units = flat_old[path].shape[0]
    share = np.stack([metrics[f"moe/{side}_{u}/requested_load"] for u in range(units)])
    counts = np.rint(share * 4 * 8 * 2).astype(int)  # 32 real tokens, k = 2
    expected = np.stack([bias_loop(flat_old[path][u], counts[u], RATE) for u in range(units)])
    np.testing.assert_allclose(flat_new[path], expected, atol=1e-7)
    kept = np.stack([metrics[f"moe/{side}_{u}/load"] for u in range(units)])  # the kept load: its own metric
    assert kept.shape == share.shape
  assert not np.allclose(flat_new[("embed", "embedding")], flat_old[("embed", "embedding")])  # the rest trained


# ---- The load that moves the biases: asked for before capacity, counted exactly, once per step (issue 39).


def requested_loop(gates, bias, padding, k, second_kept=None) -> np.ndarray:
  """The assignments asked of each expert, one token at a time: its top-k experts of gates + bias (ties to the
  lower index), padding skipped; `second_kept` [G, S]: whether the 'random' policy kept the token's second choice."""
  G, S, E = gates.shape
  counts = np.zeros(E, np.int64)
  for g in range(G):
    for s in range(S):
      if not padding[g, s]:
        continue
      scores = gates[g, s] + bias
      for j, e in enumerate(sorted(range(E), key=lambda e: (-scores[e], e))[:k]):
        if j == 1 and second_kept is not None and not second_kept[g, s]:
          continue
        counts[e] += 1
  return counts


def bias_loop(bias, counts, rate) -> np.ndarray:
  """One step of the rule, one expert at a time, in integers: up below the mean count, down above, else still."""
  E, total = len(counts), int(sum(counts))
  return np.array([b + rate * (1 if c * E < total else -1 if c * E > total else 0) for b, c in zip(bias, counts)],
                  np.float32)


CAPACITY_ROUTERS = {"gshard_all": (routers.GShard(), 2),
                    "gshard_random": (routers.GShard(second_expert_policy="random"), 2),
                    "switch": (routers.Switch(), 1), "topk": (routers.TopK(3), 3)}


@pytest.mark.parametrize("name", sorted(CAPACITY_ROUTERS))
@pytest.mark.parametrize("seed", [0, 1])
def test_requested_load_is_every_choice_of_every_real_token_before_capacity(name, seed):
  router, k = CAPACITY_ROUTERS[name]
  G, S, E = 3, 16, 6
  rng = np.random.default_rng(seed)
  logits = jnp.asarray(rng.normal(0, 2, (G, S, E)), jnp.float32)
  logits = logits.at[:, :, 0].add(1.5)  # expert 0 wanted too often: capacity drops
  padding = np.ones((G, S), bool)
  padding[1, 10:] = padding[2, 3:7] = False
  bias = jnp.asarray(rng.normal(0, 0.05, E), jnp.float32)
  key = jax.random.key(seed)
  routing = router.route(logits, router.capacity(S, E, 0.5, 1), padding_mask=jnp.asarray(padding), bias=bias,
                         rng=key if router.needs_rng else None)
  gates = np.asarray(jax.nn.softmax(logits, axis=-1))
  second_kept = None
  if name == "gshard_random":  # the policy's draw (GShard: uniform < g2 / threshold, before any position)
    e = np.argsort(-(gates + np.asarray(bias)), axis=-1, kind="stable")
    g1, g2 = np.take_along_axis(gates, e[..., :1], -1)[..., 0], np.take_along_axis(gates, e[..., 1:2], -1)[..., 0]
    second_kept = np.asarray(jax.random.uniform(key, (G, S))) < (g2 / (g1 + g2 + 1e-9)) / 0.5
  expected = requested_loop(gates, np.asarray(bias), padding, k, second_kept)
  np.testing.assert_array_equal(np.asarray(routing.requested), expected)
  kept = np.bincount(np.asarray(routing.expert_index)[np.asarray(routing.kept)], minlength=E)
  assert kept.sum() < expected.sum()  # capacity dropped some: the two loads differ
  np.testing.assert_allclose(routing.metrics["expert_load"], kept / kept.sum(), rtol=1e-6)  # the kept one, by name
  np.testing.assert_allclose(routing.metrics["requested_load"], expected / expected.sum(), rtol=1e-6)


def test_the_issue_example_moves_the_under_asked_expert_up():
  """switch, S=16, E=4, capacity factor 0.5 (C=2 per group, 2 groups), last tokens padded: asked [4, 3, 2, 11],
  kept [4, 3, 2, 4]; the kept load would lower expert 0, the asked-for load raises it."""
  real = [[0, 3, 1, 0, 3, 3, 2, 1, 3, 3, 3], [3, 0, 3, 2, 3, 0, 1, 3, 3]]  # 11 and 9 real tokens
  choice = np.array([r + [0] * (16 - len(r)) for r in real])  # padded tokens would ask for expert 0
  padding = np.arange(16)[None] < np.array([[11], [9]])
  logits = jnp.asarray(np.eye(4)[choice] * 4.0, jnp.float32)
  router = routers.Switch()
  C = router.capacity(16, 4, 0.5, 1)
  assert C == 2
  routing = router.route(logits, C, padding_mask=jnp.asarray(padding), bias=jnp.zeros(4))
  np.testing.assert_array_equal(routing.requested, [4, 3, 2, 11])
  kept = np.bincount(np.asarray(routing.expert_index)[np.asarray(routing.kept)], minlength=4)
  np.testing.assert_array_equal(kept, [4, 3, 2, 4])
  np.testing.assert_array_equal(balance.updated_bias(jnp.zeros(4), routing.requested, 1.0), [1, 1, 1, -1])


def test_capacity_binding_for_every_expert_still_moves_toward_balance():
  """Every expert asked for more than C: the kept load is C each (balanced), the asked-for one is not, and the
  biases move toward it: down for the over-asked expert, up for the others."""
  G, E = 2, 4
  choice = np.tile(np.array([0] * 14 + [1] * 6 + [2] * 6 + [3] * 6), (G, 1))  # S = 32, C = 4 below
  logits = jnp.asarray(np.eye(E)[choice] * 4.0 + np.eye(E)[(choice + 1) % E], jnp.float32)  # second: e1 + 1
  for router in (routers.Switch(), routers.GShard(), routers.TopK(2)):
    routing = router.route(logits, 4, padding_mask=None, bias=jnp.zeros(E))
    kept = np.bincount(np.asarray(routing.expert_index)[np.asarray(routing.kept)], minlength=E)
    np.testing.assert_array_equal(kept, [8, 8, 8, 8])  # capacity binds everywhere: balanced after it
    counts = np.asarray(routing.requested)
    assert counts[0] > counts[3]
    moved = np.asarray(balance.updated_bias(jnp.zeros(E), routing.requested, 0.25))
    np.testing.assert_array_equal(moved, bias_loop(np.zeros(E), counts, 0.25))
    assert moved[0] < 0 and moved[3] > 0


@pytest.mark.parametrize("E,count", [(12, 10), (4, 7), (32, 1)])
def test_equal_counts_move_nothing(E, count):
  """Every expert at the mean, exactly (in float32 fractions 1/12 rounds: a sign of rounding error moved them)."""
  bias = jnp.asarray(np.linspace(-1, 1, E), jnp.float32)
  np.testing.assert_array_equal(balance.updated_bias(bias, jnp.full((E,), count, jnp.int32), 0.5), bias)


def test_updated_bias_matches_the_loop_per_layer():
  rng = np.random.default_rng(3)
  for E in (2, 3, 5, 12, 64):
    counts = rng.integers(0, 50, (3, E))
    counts[0] = counts[0, 0]  # a layer at the mean everywhere
    counts[1, : E // 2] = counts[1].sum() // E  # some at the floor of the mean
    bias = rng.normal(0, 1, (3, E)).astype(np.float32)
    moved = np.asarray(balance.updated_bias(jnp.asarray(bias), jnp.asarray(counts, jnp.int32), 0.125))
    np.testing.assert_array_equal(moved, np.stack([bias_loop(b, c, 0.125) for b, c in zip(bias, counts)]))
  big = jnp.asarray([3 * 2**28, 2**28, 2**28, 2**28], jnp.int32)  # count_0 * E would overflow int32
  np.testing.assert_array_equal(balance.updated_bias(jnp.zeros(4), big, 1.0), [-1, 1, 1, 1])


def test_one_update_per_step_whatever_the_microbatches():
  """K=2 moves the biases exactly as K=1 on the same batch: by the counts of all its tokens, once. The rows of one
  microbatch repeat one token and those of the other another, chosen so that each microbatch alone would move
  some bias the other way (the mean of their steps would then be a half step or none)."""
  tx = optax.sgd(0.0)  # the biases move by their rule alone
  state, _, double = _bias_step(tx, num_microbatches=2)
  _, _, single = _bias_step(tx)
  old = _biases(state.params)

  def moves(step, batch):
    new, _ = step(state, batch)
    return {path: np.asarray(v - old[path]) for path, v in _biases(new.params).items()}

  alone = {t: moves(single, batch_of(np.full((4, 8), t))) for t in range(1, 32)}

  def mixed(a, b):  # microbatch 0 holds rows of a, microbatch 1 rows of b
    return batch_of(np.array([[a], [b], [a], [b]]).repeat(8, axis=1))

  def disagree(a, b):  # where each microbatch alone moves a bias the other way and the whole step moves it
    one = moves(single, mixed(a, b))
    return any(np.any((alone[a][p] * alone[b][p] < 0) & (one[p] != 0)) for p in old)

  a, b = next((a, b) for a in alone for b in alone if a < b and any(
      np.any(alone[a][p] * alone[b][p] < 0) for p in old) and disagree(a, b))
  one, two = moves(single, mixed(a, b)), moves(double, mixed(a, b))
  for path in old:
    np.testing.assert_array_equal(two[path], one[path], err_msg=str(path))
    step = np.abs(one[path])
    moved = step > RATE / 2
    np.testing.assert_allclose(step * moved, RATE * moved, rtol=1e-6)  # whole steps only, never half steps
    assert not np.any((step > 1e-6) & ~moved)

"""The routers against plain, sequential, per-token references (as test_gating does for GShard's top-2), and the
interface they share."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.config import Config
from gshard_mt.config.moe import MoeConfig
from gshard_mt.errors import ConfigError
from gshard_mt.moe import expert_choice, gating, routers
from gshard_mt.training import validate


def softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def reference_topk(logits, k, C, normalize=True, bias=None, valid=None):
  """One token at a time: (combine [G, S, E, C], aux). Choice j of every token of a group is placed before any
  choice j + 1, each in sequence order; a position counts overflowed requests too, as GShard's."""
  G, S, E = logits.shape
  valid = np.ones((G, S), bool) if valid is None else valid
  bias = np.zeros(E) if bias is None else np.asarray(bias)
  combine = np.zeros((G, S, E, C), np.float32)
  aux = []
  for g in range(G):
    gates = softmax(logits[g].astype(np.float64))
    choices = []
    for s in range(S):
      order = np.argsort(-(gates[s] + bias), kind="stable")[:k]
      w = gates[s, order]
      choices.append((order, w / (w.sum() + 1e-9) if normalize else w))
    n = max(valid[g].sum(), 1)
    density = np.bincount([choices[s][0][0] for s in range(S) if valid[g, s]], minlength=E) / n
    aux.append(np.mean(density * gates[valid[g]].sum(0) / n))
    kept = np.zeros(E, int)
    for j in range(k):
      count = kept.copy()
      for s in range(S):
        if valid[g, s]:
          e = choices[s][0][j]
          pos, count[e] = count[e], count[e] + 1
          if pos < C:
            combine[g, s, e, pos] = choices[s][1][j]
            kept[e] += 1
  return combine, float(np.mean(aux) * E * E)


def reference_expert_choice(logits, C, valid):
  """Expert by expert: its C real tokens of highest gate, best first."""
  G, S, E = logits.shape
  combine = np.zeros((G, S, E, C), np.float32)
  for g in range(G):
    gates = softmax(logits[g].astype(np.float64))
    for e in range(E):
      ranked = [s for s in np.argsort(-gates[:, e], kind="stable") if valid[g, s]]
      for c, s in enumerate(ranked[:C]):
        combine[g, s, e, c] = gates[s, e]
  return combine


def inputs(G, S, E, pad, seed=0, scale=2.0):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(G, S, E)) * scale).astype(np.float32), rng.uniform(size=(G, S)) >= pad


@jax.jit
def _dense(routing):
  return routing.combine_weights, routing.dispatch_mask


@pytest.mark.parametrize("G,S,E,C,k,normalize,pad,biased", [
    (2, 16, 4, 3, 1, False, 0.2, False),  # switch, overflowing
    (3, 24, 8, 4, 3, True, 0.1, True),  # top-3 with a selection bias
    (2, 20, 5, 20, 4, True, 0.3, False),  # top-4, C = S: dropless
])
def test_topk_matches_sequential_reference(G, S, E, C, k, normalize, pad, biased):
  logits, valid = inputs(G, S, E, pad, seed=k)
  bias = np.linspace(-0.3, 0.3, E).astype(np.float32) if biased else None
  routing = jax.jit(gating.topk_gating, static_argnums=(1, 2), static_argnames="normalize")(
      logits, k, C, normalize=normalize, bias=bias, padding_mask=valid)
  combine, aux = reference_topk(logits, k, C, normalize, bias, valid)
  got_combine, got_dispatch = _dense(routing)
  np.testing.assert_allclose(got_combine, combine, atol=1e-6)
  np.testing.assert_array_equal(got_dispatch, combine > 0)
  np.testing.assert_allclose(routing.aux_loss, aux, rtol=1e-5)
  assert routing.expert_index.shape == (G, S, k)
  if C < S:
    assert 0 < float(gating.dropped_fractions(routing.metrics)[0]) < 1


def test_topk_with_two_choices_is_gshard_top2_with_policy_all():
  logits, valid = inputs(3, 32, 8, 0.2, seed=5)
  got = jax.jit(lambda z, m: gating.topk_gating(z, 2, 5, padding_mask=m))(logits, valid)
  want = jax.jit(lambda z, m: gating.top2_gating(z, 5, padding_mask=m))(logits, valid)
  for field in ("expert_index", "slot", "kept"):
    np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
  for a, b in zip(jax.tree.leaves((got.weight, got.aux_loss, got.z_loss, got.metrics)),
                  jax.tree.leaves((want.weight, want.aux_loss, want.z_loss, want.metrics))):
    np.testing.assert_allclose(a, b, rtol=1e-6)  # XLA fuses the two differently: 1 ulp apart at most
  assert got.metrics.keys() == want.metrics.keys()


def test_expert_choice_matches_sequential_reference():
  G, S, E, C = 2, 12, 4, 5
  logits, valid = inputs(G, S, E, 0.4, seed=3)  # a group may have fewer than C real tokens
  routing = jax.jit(expert_choice.expert_choice_gating, static_argnums=1)(logits, C, padding_mask=valid)
  np.testing.assert_allclose(_dense(routing)[0], reference_expert_choice(logits, C, valid), atol=1e-6)
  assert float(routing.aux_loss) == 0.0
  kept = np.asarray(routing.kept)
  np.testing.assert_allclose(routing.metrics["unrouted"], (~kept.any(-1))[valid].mean(), rtol=1e-6)


def test_selection_bias_chooses_but_does_not_weigh():
  logits, _ = inputs(1, 16, 4, 0.0, seed=1)
  bias = jnp.array([0.0, 0.0, 0.0, 5.0])  # expert 3 first for every token
  routing = jax.jit(gating.topk_gating, static_argnums=(1, 2))(logits, 2, 16, bias=bias)
  assert (np.asarray(routing.expert_index[..., 0]) == 3).all()
  gates = softmax(logits)[0]
  chosen = np.take_along_axis(gates, np.asarray(routing.expert_index[0]), -1)
  np.testing.assert_allclose(routing.weight[0], chosen / chosen.sum(-1, keepdims=True), rtol=1e-5)


def test_top1_keeps_the_softmax_gate_so_the_loss_reaches_the_router_except_languages_weight_1():
  """A top-1 gate renormalised over itself is 1, and the loss would reach the router only through the balancing
  losses: top-k and dropless at k = 1 weigh their expert by the softmax gate, as Switch does; the language router,
  whose gate would be a constant of the language, by 1 (what makes tools/extract.py's smaller model exact)."""
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(1, 8, 4)), jnp.float32)
  gates = softmax(np.asarray(logits))
  switch = routers.Switch().route(logits, 8)
  np.testing.assert_allclose(switch.weight[..., 0], gates.max(-1), rtol=1e-6)
  for router in (routers.TopK(1), routers.Dropless(1)):
    routing = router.route(logits, 8)
    np.testing.assert_array_equal(routing.weight, switch.weight)
    pull = jax.grad(lambda x, r=router: jnp.sum(r.route(x, 8).weight * jnp.arange(8.0)[None, :, None]))(logits)
    assert float(jnp.abs(pull).max()) > 1e-3  # the router learns from what its expert's output is worth
  np.testing.assert_allclose(routers.Language(1).route(logits, 8).weight, 1.0, rtol=1e-6)
  assert routers.TopK(2).normalize and routers.Dropless(3).normalize and not routers.Switch().normalize


def test_capacity_lets_a_later_first_choice_drop_an_earlier_second_as_gshards_priority_does():
  """`causal` is about the choice of experts: top-2's choices are each token's own, but with capacity a later
  token's first choice takes the slot an earlier token's second choice wanted (GShard's priority, section 2.2)."""
  def token0_kept(last):
    logits = jnp.asarray([[[2.0, 1.0], [2.0, 1.0], last]])  # S = 3, E = 2
    return gating.topk_gating(logits, 2, 1).kept[0, 0].tolist()  # C = 1

  assert token0_kept([0.0, 3.0]) == [True, False]  # token 2's first choice, expert 1, takes its one slot
  assert token0_kept([3.0, 0.0]) == [True, True]  # token 2 wants expert 0 first: expert 1's slot is token 0's


def test_every_router_is_one_registered_class_that_carries_its_properties():
  S, E = 64, 8
  names = routers.ROUTERS.names()
  assert set(names) == {"gshard", "switch", "topk", "expert_choice", "dropless", "language"}
  for name in names:
    cls = routers.ROUTERS.get(name)
    assert issubclass(cls, routers.Router), name
    cfg = dataclasses.replace(MoeConfig(), router=name, num_selected=3, decoder_router="topk")
    router = routers.make_router(cfg)
    assert type(router) is cls and routers.router_class(cfg) is cls
    C = router.capacity(S, E, 1.0, 1)
    assert C == {"gshard": 16, "switch": 8, "topk": 24, "expert_choice": 24}.get(name, S), name
    assert cls.uses_capacity == (name not in ("dropless", "language"))
    assert cls.causal == (name != "expert_choice") and cls.reads_language == (name == "language")
    assert routers.experts_per_token(cfg) == {"gshard": 2, "switch": 1}.get(name, 3)
    if not cls.uses_capacity:  # C = S: only the grouped dispatch computes no empty slot
      with pytest.raises(ConfigError, match="has no capacity"):
        validate.check(Config(moe=dataclasses.replace(cfg, dispatch="index")))
  with pytest.raises(ConfigError, match="not causal"):
    validate.check(Config(moe=MoeConfig(router="expert_choice")))
  with pytest.raises(ConfigError, match=r"moe.router='nope': expected one of \('gshard'"):
    validate.check(Config(moe=MoeConfig(router="nope")))
  assert routers.make_router(MoeConfig(second_expert_policy="random"), deterministic=False).second_expert_policy \
      == "random"
  assert routers.make_router(MoeConfig(second_expert_policy="random")).second_expert_policy == "all"
  assert routers.make_router(MoeConfig(router="expert_choice", decoder_router="switch"), decoder=True).k == 1
  assert routers.ExpertChoice(4).capacity(8, 2, 2.0, 1) == 8  # at most S


class Hash(routers.Router):
  """A router written outside the package (Hash layers, Roller et al. 2021, simplified): token s of a group goes to
  expert s mod E, with capacity, weighted by its softmax gate."""

  k = 1

  @classmethod
  def experts_per_token(cls, num_selected: int) -> int:
    return 1

  @classmethod
  def from_config(cls, cfg, *, deterministic: bool = True):
    return cls()

  def route(self, logits, capacity, *, padding_mask=None, rng=None, bias=None):
    G, S, E = logits.shape
    chosen = jax.nn.one_hot(jnp.arange(S) % E, E)[None] * 100.0  # far above any logit: the hash decides
    return gating.topk_gating(logits + chosen, 1, capacity, normalize=False, bias=bias, padding_mask=padding_mask)


@pytest.fixture
def hash_router():
  routers.ROUTERS.register("test_hash")(Hash)
  yield
  routers.ROUTERS.unregister("test_hash")


def test_a_router_registered_outside_the_package_trains(hash_router):
  """One class and one registration, in this file: the config accepts it, the model routes by it, two train
  steps run, and the logged metrics are the same as any router's."""
  import functools

  import flax.linen as nn
  import optax

  from gshard_mt.model.transformer import Transformer, TransformerConfig, dummy_batch
  from gshard_mt.training.step import TrainState, train_step
  from tests.helpers import small_config

  with pytest.raises(ConfigError, match="moe.router='test_hashh': expected one of"):
    small_config(**{"moe.router": "test_hashh"})
  config = small_config(**{"moe.router": "test_hash", "moe.group_size": 16, "model.moe_interval": 1,
                           "model.num_encoder_layers": 1, "model.num_decoder_layers": 1, "data.max_length": 8})
  model = Transformer(TransformerConfig.from_config(config, 32), deterministic=False)
  params = nn.unbox(model.init(jax.random.key(0), dummy_batch(1, 8))["params"])
  tx = optax.adam(1e-3)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                     rng=jax.random.key_data(jax.random.key(1)))
  step = jax.jit(functools.partial(train_step, model=model, tx=tx, config=config))
  batch = dummy_batch(4, 8) | {"inputs": jnp.arange(32).reshape(4, 8) % 31 + 1,
                               "targets": jnp.arange(32).reshape(4, 8) % 29 + 1}
  for _ in range(2):
    state, metrics = step(state, batch)
    assert np.isfinite(float(metrics["loss"]))
  assert int(state.step) == 2
  # token s of each group of 16 goes to expert s mod 4: every expert asked for equally often
  np.testing.assert_allclose(metrics["moe/encoder_0/requested_load"], np.full(4, 0.25))
  assert {"moe/encoder_0/top1_dropped", "moe/decoder_0/top2_dropped"} <= set(metrics)


def test_the_moe_config_imports_no_jax_nor_the_routers():
  import subprocess
  import sys

  code = ("import sys\nfrom gshard_mt.config import moe as config\nassert 'jax' not in sys.modules\n"
          "assert config.MoeConfig(router='switch').router_of(decoder=True) == 'switch'\n"
          "assert 'gshard_mt.moe.routers' not in sys.modules\n")
  subprocess.run([sys.executable, "-c", code], check=True)

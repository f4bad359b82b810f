"""The MoE layer with each router: every dispatch path a router supports gives the outputs and gradients of a plain
per-token reference (each kept assignment's gate x its expert's FFN of the token); shared experts; the selection
bias and its update; the config's refusals."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.config import Config
from gshard_mt.config.moe import MoeConfig
from gshard_mt.errors import ConfigError
from gshard_mt.moe import balance, gating, routers
from gshard_mt.moe.layer import MoeFeedForward
from gshard_mt.training import validate
from tests.helpers import small_config

B, L, M, H, E, S = 4, 16, 8, 16, 4, 16  # G = B * L / S = 4 groups
BASE = MoeConfig(num_experts=E, hidden_dim=H, group_size=S, train_capacity_factor=1.0, eval_capacity_factor=1.0,
                 min_capacity=1, second_expert_policy="all", z_loss_weight=0.1, dispatch="index")


@functools.cache
def inputs():
  """x, mask, language and the parameters of every case: those of a layer with all of them (shared experts and
  a selection bias that changes some choices; a layer ignores the ones it does not use)."""
  keys = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(keys[0], (B, L, M))
  mask = jnp.arange(L)[None, :] < jnp.array([16, 12, 9, 5])[:, None]
  language = jax.random.normal(keys[1], (B, 1, M)).repeat(L, axis=1)  # one vector per sentence
  everything = dataclasses.replace(BASE, shared_experts=2, balance="bias", aux_loss_weight=0.0)
  params = nn.unbox(jax.jit(MoeFeedForward(everything).init)(keys[2], x, mask))
  params["params"][balance.NAME] = jnp.array([0.0, 0.3, -0.2, 0.1])
  return x, mask, language, params


def reference(params, x, mask, language, cfg):
  """y [B, L, M]: per token, the sum over its kept assignments of gate x FFN_e(token) (+ the shared experts), the
  routing being the router's own (tested against sequential references in test_routers)."""
  p = params["params"]
  router = routers.make_router(cfg)
  xg = x.reshape(-1, S, M)
  router_in = (language if router.reads_language else x).reshape(-1, S, M)
  bias = p[balance.NAME] if cfg.balance == "bias" else None
  routing = router.route(jnp.einsum("GSM,ME->GSE", router_in, p["wg"]),
                         router.capacity(S, E, cfg.eval_capacity_factor, cfg.min_capacity),
                         padding_mask=mask.reshape(-1, S), bias=bias)
  wi, wo = p["wi"][routing.expert_index], p["wo"][routing.expert_index]  # [G, S, K, M, H], [G, S, K, H, M]
  out = jnp.einsum("GSKH,GSKHM->GSKM", jax.nn.relu(jnp.einsum("GSM,GSKMH->GSKH", xg, wi)), wo)
  y = jnp.einsum("GSK,GSKM->GSM", routing.weight, out)
  if cfg.shared_experts:
    h = jax.nn.relu(jnp.einsum("GSM,ZMH->GSZH", xg, p["shared_wi"]))
    y = y + jnp.einsum("GSZH,ZHM->GSM", h, p["shared_wo"])
  return y.reshape(B, L, M), routing


def loss_and_grads(apply):
  """(loss, (y, top-1 dropped)), gradients of a scalar that reads y, the aux loss and the z-loss."""
  def loss(params, x):
    y, aux, z, dropped = apply(params, x)
    return jnp.sum(jnp.sin(y) * x) + aux + 0.1 * z, (y, dropped)
  return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)


ALL = ("einsum", "index", "index_gather", "grouped", "shard_map")  # shard_map on one device: its program, whole
CASES = {  # name: (config changes, the dispatch paths compared with the reference: all that the router takes)
    "switch": (dict(router="switch"), ALL),
    "topk3": (dict(router="topk", num_selected=3), ALL),
    "expert_choice": (dict(router="expert_choice", decoder_router="topk"), ALL),
    "dropless": (dict(router="dropless", dispatch="grouped"), ("grouped",)),
    "language": (dict(router="language", dispatch="grouped"), ("grouped",)),
    "gshard_bias_shared": (dict(balance="bias", aux_loss_weight=0.0, shared_experts=2), ALL),
}


@pytest.mark.parametrize("case", CASES)
def test_every_path_matches_the_per_token_reference(case):
  change, paths = CASES[case]
  cfg = dataclasses.replace(BASE, **change)
  x, mask, language, params = inputs()

  def via_reference(params, x):
    y, routing = reference(params, x, mask, language, cfg)
    return y, routing.aux_loss, routing.z_loss, routing.metrics["choices_dropped"]

  def via_layer(path):
    layer = MoeFeedForward(dataclasses.replace(cfg, dispatch=path))

    def apply(params, x):
      y, stats = layer.apply(params, x, mask, language=language)
      return y, stats["aux_loss"], stats["z_loss"], stats["metrics"]["choices_dropped"]
    return apply

  # One compilation for the reference and every path.
  ref, *got = jax.jit(lambda p, x: [loss_and_grads(f)(p, x) for f in [via_reference, *map(via_layer, paths)]])(
      params, x)
  if case == "switch":  # capacity drops some: the paths must drop the same ones
    assert float(ref[0][1][1][0]) > 0  # first choices dropped
  for path, out in zip(paths, got):
    np.testing.assert_allclose(out[0][0], ref[0][0], rtol=1e-5, err_msg=path)
    np.testing.assert_allclose(out[0][1][0], ref[0][1][0], atol=1e-5, err_msg=path)
    for g, r in zip(jax.tree.leaves(out[1]), jax.tree.leaves(ref[1])):
      np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-5, err_msg=path)
    assert not np.asarray(out[1][0]["params"][balance.NAME]).any()  # it chooses only: no gradient reaches it


def test_the_layer_writes_the_assignments_its_router_asked_for_while_training():
  """moe.balance='bias': the layer writes its requested counts (every choice of every real token, before capacity)
  where its bias lives; the train step moves the bias by them (`balance.moved_biases`), nothing else does."""
  cfg = dataclasses.replace(BASE, router="topk", balance="bias", aux_loss_weight=0.0, bias_update_rate=0.25)
  x, mask, _, params = inputs()
  layer = MoeFeedForward(cfg)
  (_, stats), updates = jax.jit(lambda p: layer.apply(p, x, mask, deterministic=False,
                                                      mutable=[balance.COLLECTION]))(params)
  counts = np.asarray(updates[balance.COLLECTION][balance.NAME])
  k = routers.experts_per_token(cfg)
  assert counts.dtype == np.int32 and counts.sum() == k * np.asarray(mask).astype(bool).sum()
  np.testing.assert_allclose(counts / counts.sum(), stats["metrics"]["requested_load"], rtol=1e-6)
  moved = balance.moved_biases(params["params"], updates[balance.COLLECTION], 0.25)
  merged = balance.with_updated_biases(params["params"], moved)
  bias = params["params"][balance.NAME]
  np.testing.assert_array_equal(merged[balance.NAME], balance.updated_bias(bias, counts, 0.25))
  assert (merged[balance.NAME] != bias).any()
  np.testing.assert_array_equal(merged["wi"], params["params"]["wi"])
  # Evaluating, or with the collection immutable, the bias stays.
  assert jax.jit(lambda p: layer.apply(p, x, mask, mutable=[balance.COLLECTION])[1])(params) == {}


def test_language_router_sends_a_sentence_to_one_set_of_experts():
  cfg = dataclasses.replace(BASE, router="language", dispatch="grouped", num_selected=2)
  x, mask, language, params = inputs()
  _, routing = jax.jit(lambda p: reference(p, x, mask, language, cfg))(params)
  experts = np.sort(np.asarray(routing.expert_index).reshape(B, L, 2), axis=-1)
  assert (experts == experts[:, :1]).all()  # every token of a row (a sentence) has its row's experts
  with pytest.raises(ValueError, match="routes by the source language"):
    MoeFeedForward(cfg).apply(params, x, mask)


@pytest.mark.parametrize("change, message", [
    (dict(router="expert_choice"), "moe.router='expert_choice' in the decoder: .* not causal"),
    (dict(router="topk", decoder_router="expert_choice"), "'expert_choice' in the decoder"),
    (dict(router="dropless"), "moe.router='dropless' has no capacity: it needs moe.dispatch='grouped'"),
    (dict(router="switch", decoder_router="language", dispatch="einsum"), "'language' has no capacity"),
    (dict(balance="bias"), "moe.balance='bias' balances without the auxiliary loss"),
    (dict(router="topk", num_selected=5), "moe.num_selected=5: expected 1 to 4"),
    (dict(router="topk", num_selected=3, num_experts=2), "moe.num_experts=2: top-3 gating needs at least 3"),
    (dict(router="top1"), "moe.router='top1': expected one of"),
    (dict(balance="sign"), "moe.balance='sign': expected one of"),
    (dict(shared_experts=-1), "moe.shared_experts=-1"),
])
def test_config_refuses_impossible_combinations_in_one_line(change, message):
  with pytest.raises(ConfigError, match=message) as error:
    validate.check(Config(moe=dataclasses.replace(MoeConfig(), **change)))
  assert "\n" not in str(error.value)


def test_language_router_needs_source_tags():
  with pytest.raises(ConfigError, match="moe.router='language' routes by the source-language tag"):
    small_config(**{"moe.router": "language", "moe.dispatch": "grouped", "data.source_tags": False})


def test_capacity_of_gshard_unchanged():
  assert gating.expert_capacity(256, 32, 1.25) == 20
  assert gating.expert_capacity(256, 32, 1.25, num_selected=1) == 10

"""The MoE layer: every dispatch path agrees, dropped tokens pass through, gradients reach the router, errors."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from gshard_mt.config.moe import MoeConfig
from gshard_mt.errors import ConfigError
from gshard_mt.moe import ffn, gating, manual
from gshard_mt.moe.gating import expert_capacity
from gshard_mt.moe.layer import MoeFeedForward

B, L, M, H, E = 4, 16, 8, 16, 4


def make_layer(dtype=jnp.float32, **kw):
  defaults = dict(num_experts=E, hidden_dim=H, group_size=16, train_capacity_factor=1.0, eval_capacity_factor=1.0,
                  dispatch="index",
                  min_capacity=1, second_expert_policy="all")
  return MoeFeedForward(MoeConfig(**{**defaults, **kw}), dtype=dtype)


@functools.cache
def inputs():
  x = jax.random.normal(jax.random.key(0), (B, L, M))
  mask = jnp.arange(L)[None, :] < jnp.array([16, 12, 9, 5])[:, None]
  params = nn.unbox(make_layer().init(jax.random.key(1), x, mask))
  return x, mask, params


def loss_and_grads(dispatch, params, x, mask, **kw):
  layer = make_layer(dispatch=dispatch, **kw)

  def loss(params, x):
    y, stats = layer.apply(params, x, mask, deterministic=False, rngs={"gating": jax.random.key(5)})
    return jnp.sum(jnp.sin(y) * x) + stats["aux_loss"] + 0.1 * stats["z_loss"], y

  (value, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
  return value, y, grads


@pytest.mark.parametrize("dispatch,policy", [("index", "all"), ("index", "random"), ("index_gather", "random"),
                                             ("shard_map", "random")])
def test_dispatch_matches_einsum_outputs_and_gradients(dispatch, policy):
  # shard_map on one device runs its per-device program whole (8 fake devices: test_partitioning).
  x, mask, params = inputs()
  ref = loss_and_grads("einsum", params, x, mask, second_expert_policy=policy, jitter_noise=0.1)
  got = loss_and_grads(dispatch, params, x, mask, second_expert_policy=policy, jitter_noise=0.1)
  np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
  np.testing.assert_allclose(got[1], ref[1], atol=1e-5)
  for g, r in zip(jax.tree.leaves(got[2]), jax.tree.leaves(ref[2])):
    np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-5)
  # The gradient reaches the router weights.
  assert float(jnp.abs(got[2][0]["params"]["wg"]).max()) > 1e-4


@pytest.mark.parametrize("capacity_factor, overflow", [(0.5, True), (4.0, False)])
def test_grouped_matches_einsum_with_and_without_overflow(capacity_factor, overflow):
  """Capacity still caps each expert in the grouped path: the same assignments are dropped, so outputs and
  gradients equal the einsum path's both when some overflow and when none does."""
  x, mask, params = inputs()
  kw = dict(train_capacity_factor=capacity_factor, second_expert_policy="all")
  ref = loss_and_grads("einsum", params, x, mask, **kw)
  got = loss_and_grads("grouped", params, x, mask, **kw)
  _, stats = jax.jit(lambda p: make_layer(**kw).apply(p, x, mask, deterministic=False,
                                                      rngs={"gating": jax.random.key(5)}))(params)
  dropped = float(stats["metrics"]["choices_dropped"].sum())
  assert (dropped > 0) == overflow
  np.testing.assert_allclose(got[1], ref[1], atol=1e-5)
  for g, r in zip(jax.tree.leaves(got[2]), jax.tree.leaves(ref[2])):
    np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dispatch", ["einsum", "index", "index_gather", "shard_map", "grouped"])
def test_token_dropped_by_both_experts_gets_zero_output(dispatch):
  x, mask, params = inputs()
  layer = make_layer(dispatch=dispatch, eval_capacity_factor=0.125)
  C = expert_capacity(16, E, 0.125, min_capacity=1)
  assert C == 1  # most tokens overflow
  apply = jax.jit(lambda p, x, m: layer.apply(p, x, m, deterministic=True))
  y, stats = apply(params, x, mask)
  routing = jax.jit(lambda p, x, m: gating.top2_gating(
      jnp.einsum("GSM,ME->GSE", x.reshape(-1, 16, M), p["params"]["wg"]), C, padding_mask=m.reshape(-1, 16)))(
          params, x, mask)
  unrouted = ~np.asarray(routing.kept).any(-1).reshape(B, L)
  assert unrouted.sum() > B * L / 2
  np.testing.assert_array_equal(np.asarray(y)[unrouted], 0.0)
  np.testing.assert_array_equal(np.asarray(y)[~np.asarray(mask)], 0.0)  # padding is never dispatched
  assert float(stats["metrics"]["unrouted"]) > 0.5


def test_capacity_factors_train_and_eval():
  x, mask, params = inputs()
  layer = make_layer(train_capacity_factor=0.5, eval_capacity_factor=4.0)
  _, train = layer.apply(params, x, mask, deterministic=False, rngs={"gating": jax.random.key(0)})
  _, evals = layer.apply(params, x, mask, deterministic=True)
  assert expert_capacity(16, E, 4.0, 1) == 32  # room for every assignment
  assert float(evals["metrics"]["choices_dropped"].sum()) == 0.0
  assert float(train["metrics"]["choices_dropped"][0]) > 0.0


def test_jitter_noise_only_in_training_and_logit_cap():
  x, mask, params = inputs()
  plain, noisy = make_layer(), make_layer(jitter_noise=0.5)
  y0, _ = plain.apply(params, x, mask, deterministic=True)
  y1, _ = noisy.apply(params, x, mask, deterministic=True)
  np.testing.assert_array_equal(y0, y1)
  rngs = {"gating": jax.random.key(9)}
  t0, _ = plain.apply(params, x, mask, deterministic=False, rngs=rngs)
  t1, _ = noisy.apply(params, x, mask, deterministic=False, rngs=rngs)
  t2, _ = noisy.apply(params, x, mask, deterministic=False, rngs=rngs)
  assert not np.allclose(t0, t1)
  np.testing.assert_array_equal(t1, t2)  # same rng, same noise
  big = jax.tree.map(lambda p: p * 100.0, params)
  _, uncapped = make_layer().apply(big, x, mask)
  _, capped = make_layer(router_logit_cap=2.0).apply(big, x, mask)
  assert float(capped["z_loss"]) < float(uncapped["z_loss"])
  assert float(capped["metrics"]["router_entropy"]) > float(uncapped["metrics"]["router_entropy"])


def test_bf16_compute_keeps_router_in_float32():
  """The experts compute in bf16, but the router sees the float32 input: its losses and statistics agree with
  the float32 layer's to float32 precision (a bf16 router would be off by about 1e-3)."""
  x, mask, params = inputs()
  y, stats = make_layer(dtype=jnp.bfloat16).apply(params, x, mask)
  ref, ref_stats = make_layer().apply(params, x, mask)
  assert y.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(y, np.float32), ref, atol=0.02)  # bf16's error here: 0.0076 at most
  for value, expected in ((stats["aux_loss"], ref_stats["aux_loss"]), (stats["z_loss"], ref_stats["z_loss"]),
                          (stats["metrics"]["router_entropy"], ref_stats["metrics"]["router_entropy"])):
    assert value.dtype == jnp.float32
    np.testing.assert_allclose(value, expected, rtol=1e-6)


def test_evaluation_pads_groups_that_do_not_divide():
  x, mask, params = inputs()
  roomy = dict(eval_capacity_factor=8.0)  # nothing dropped, so the grouping cannot change any output
  one_group, _ = make_layer(group_size=64, **roomy).apply(params, x, mask)
  padded, _ = make_layer(group_size=24, **roomy).apply(params, x, mask)  # 3 groups, the last one padded
  np.testing.assert_allclose(padded, one_group, atol=1e-6)


@pytest.mark.parametrize("kw, message", [
    (dict(group_size=24), "group_size=24 does not divide the 64 tokens"),
    (dict(second_expert_policy="top"), "moe.second_expert_policy='top': expected one of"),
])
def test_layer_config_errors(kw, message):
  x, mask, _ = inputs()
  with pytest.raises((ValueError, ConfigError), match=message):  # training: groups must divide the batch exactly
    make_layer(**kw).init({"params": jax.random.key(0), "gating": jax.random.key(1)}, x, mask,
                          deterministic=False)


@pytest.mark.parametrize("group_spec,expert_spec,message", [
    (P("data", None, None), P("expert", None, None), "needs the groups split over the expert axis 'expert'"),
    (P(("data", "expert"), None, None), P(("data", "expert"), None, None), "experts on one mesh axis"),
    (P(("data", "expert"), None, None), P("expert", "data", None), "M unsplit"),
])
def test_shard_map_rejects_layouts_it_cannot_run(group_spec, expert_spec, message):
  x, _, params = inputs()
  routing = gating.top2_gating(jnp.zeros((4, 16, E)), 8)
  mesh = jax.sharding.AbstractMesh((2, 4), ("data", "expert"))
  with jax.sharding.use_abstract_mesh(mesh), pytest.raises(ValueError, match=message):
    manual.moe_shard_map(x.reshape(4, 16, M), routing, ffn.ExpertWeights(params["params"]["wi"],
                                                                          params["params"]["wo"]), ffn.relu,
                         group_spec=group_spec, expert_spec=expert_spec)


def biased_weights(params, seed=6) -> ffn.ExpertWeights:
  """The layer's experts with a bias on each of their two matmuls, as a change to the experts would add them."""
  k1, k2 = jax.random.split(jax.random.key(seed))
  return ffn.ExpertWeights(params["params"]["wi"], params["params"]["wo"], bi=jax.random.normal(k1, (E, H)),
                           bo=jax.random.normal(k2, (E, M)))


def plain_experts(x, routing, weights) -> np.ndarray:
  """A loop over tokens and their kept assignments: y[g, s] = sum_k weight * (relu(x wi_e + bi_e) wo_e + bo_e)."""
  x, w = np.asarray(x, np.float64), jax.tree.map(lambda a: np.asarray(a, np.float64), weights)
  y = np.zeros_like(x)
  G, S, K = routing.expert_index.shape
  for g, s, k in np.ndindex(G, S, K):
    if routing.kept[g, s, k]:
      e = int(routing.expert_index[g, s, k])
      h = np.maximum(x[g, s] @ w.wi[e] + w.bi[e], 0)
      y[g, s] += float(routing.weight[g, s, k]) * (h @ w.wo[e] + w.bo[e])
  return y


def test_every_dispatch_applies_the_same_experts_behind_one_interface():
  """Every moe.dispatch path, given experts with biases (added in one place, `ffn.ExpertWeights`), equals a plain
  loop over the tokens' kept assignments, some dropped for capacity."""
  from gshard_mt.moe import experts
  from gshard_mt.moe.experts import PATHS as DISPATCHES

  _, _, params = inputs()
  weights = biased_weights(params)
  routing = gating.top2_gating(jax.random.normal(jax.random.key(3), (2, 16, E)) * 2, 4)  # C = 4: some dropped
  assert not np.asarray(routing.kept).all()
  x = jax.random.normal(jax.random.key(4), (2, 16, M))
  want = plain_experts(x, routing, weights)
  for name in DISPATCHES:
    path = experts.expert_path(MoeConfig(num_experts=E, hidden_dim=H, dispatch=name), jnp.float32)
    assert isinstance(path, experts.ExpertPath)
    np.testing.assert_allclose(jax.jit(path)(x, routing, weights), want, atol=1e-4, err_msg=name)


def biased_shard_map_check():
  """On 4 CPU devices: with biased experts, the shard_map path's output and gradients (the biases' too) equal the
  index path's on meshes that split the groups, the experts and the hidden units (the output bias is added once,
  after the sum over the model axis)."""
  import dataclasses

  from gshard_mt.moe import experts
  from gshard_mt.parallel import mesh as mesh_lib
  from gshard_mt.parallel import rules as rules_lib

  _, _, params = inputs()
  weights = biased_weights(params)
  routing = gating.top2_gating(jax.random.normal(jax.random.key(3), (4, 16, E)) * 2, 6)
  x = jax.random.normal(jax.random.key(4), (4, 16, M))
  cfg = MoeConfig(num_experts=E, hidden_dim=H)
  for shape in ((2, 2, 1), (1, 2, 2)):
    mesh = jax.make_mesh(shape, mesh_lib.MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)
    got = {}
    for dispatch in ("index", "shard_map"):
      path = experts.expert_path(dataclasses.replace(cfg, dispatch=dispatch), jnp.float32)
      loss = lambda x, w, path=path: jnp.sum(jnp.sin(path(x, routing, w)) * x)  # noqa: E731
      with jax.set_mesh(mesh), nn.logical_axis_rules(rules_lib.RULES["expert_model" if shape[2] > 1 else "expert"]):
        got[dispatch] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, weights)
    for a, b in zip(jax.tree.leaves(got["shard_map"]), jax.tree.leaves(got["index"])):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=str(shape))
  print("OK")


def test_shard_map_applies_biased_experts_as_the_automatic_path_on_several_devices():
  from tests.helpers import run_on_cpu_devices

  run_on_cpu_devices("tests.unit.test_moe_layer", "biased_shard_map_check")


def bfloat16_shard_map_check():
  """On 4 CPU devices, bfloat16: the shard_map dispatch's gradients equal the index dispatch's (its weights were
  cast to bf16 before shard_map, so their gradients came out rounded to bf16), on meshes that split the groups, the
  experts and the hidden units (XLA's CPU compiler aborted on the bf16 all-reduces there)."""
  import dataclasses

  from gshard_mt.parallel import mesh as mesh_lib
  from gshard_mt.parallel import rules as rules_lib

  cfg = MoeConfig(num_experts=4, hidden_dim=16, group_size=8, second_expert_policy="all", activation="gelu",
                  dispatch="index")
  x = jax.random.normal(jax.random.key(0), (4, 8, 8))
  params = nn.unbox(MoeFeedForward(cfg).init(jax.random.key(1), x))
  for shape in ((2, 2, 1), (4, 1, 1), (1, 2, 2)):
    mesh = jax.make_mesh(shape, mesh_lib.MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)
    grads = {}
    for dispatch in ("index", "shard_map"):
      layer = MoeFeedForward(dataclasses.replace(cfg, dispatch=dispatch), dtype=jnp.bfloat16)
      loss = lambda p, layer=layer: jnp.sum(layer.apply(p, x, deterministic=False)[0].astype(jnp.float32) * x)  # noqa: E731
      with jax.set_mesh(mesh), nn.logical_axis_rules(rules_lib.RULES["expert_model" if shape[2] > 1 else "expert"]):
        grads[dispatch] = jax.jit(jax.grad(loss))(params)["params"]
    for name in ("wi", "wo", "wg"):
      np.testing.assert_allclose(grads["shard_map"][name], grads["index"][name], rtol=1e-5, atol=1e-6,
                                 err_msg=f"{shape} {name}")
  print("OK")


def test_shard_map_in_bfloat16_keeps_float32_weight_gradients_on_several_devices():
  from tests.helpers import run_on_cpu_devices

  run_on_cpu_devices("tests.unit.test_moe_layer", "bfloat16_shard_map_check")

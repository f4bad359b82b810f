"""Shardings derived from logical axes: parameters, every optimizer-state leaf, the batch."""

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from gshard_mt.parallel import shardings
from gshard_mt.training.setup import build
from tests.helpers import small_config

MIN_DIM_TO_FACTOR = 128  # optax.adafactor's default


def setup_for(optimizer):
  # 'expert_model' gives E, H, heads and V their own mesh axes, so a wrongly derived leaf shows; dims of 128+
  # make Adafactor factor its second moments.
  config = small_config(**{"optimizer.name": optimizer, "partitioning": "expert_model", "model.emb_dim": 128,
                           "model.mlp_dim": 256, "moe.hidden_dim": 256, "model.head_dim": 64})
  return build(config, 600, devices=jax.devices()[:1])


def params_by_path(setup):
  specs = jax.tree.map(lambda s: s.spec, setup.state_shardings.params)
  flat = jax.tree_util.tree_flatten_with_path(setup.abstract_state.params)[0]
  spec_leaves = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P))
  return {path: (leaf.shape, spec) for (path, leaf), spec in zip(flat, spec_leaves)}


def per_param(state, kind):
  """{param path: leaf} of one per-parameter field of the optimizer state (e.g. Adam's mu)."""
  node = next(s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, kind)) if isinstance(s, kind))
  return node


def without(spec, dim):
  return P(*[axis for i, axis in enumerate(spec) if i != dim])


def test_adam_moments_are_sharded_like_their_parameters():
  setup = setup_for("adam")
  params = params_by_path(setup)
  state = per_param(setup.state_shardings.opt_state, optax.ScaleByAdamState)
  assert state.count.spec == P()
  for field in (state.mu, state.nu):
    got = jax.tree_util.tree_flatten_with_path(field)[0]
    assert len(got) == len(params)
    for path, sharding in got:
      assert sharding.spec == params[path][1], jax.tree_util.keystr(path)
  assert any("model" in str(spec) for _, spec in params.values())  # the test sees split parameters


def test_adafactor_factored_moments_drop_the_reduced_dimension():
  setup = setup_for("adafactor")
  params = params_by_path(setup)
  state = per_param(setup.state_shardings.opt_state, optax.FactoredState)
  factored = 0
  for path, (shape, spec) in params.items():
    d1, d0 = np.argsort(shape)[-2:] if len(shape) >= 2 else (None, None)
    is_factored = d1 is not None and shape[d1] >= MIN_DIM_TO_FACTOR
    row = _at(state.v_row, path).spec
    col = _at(state.v_col, path).spec
    full = _at(state.v, path).spec
    if is_factored:
      factored += 1
      assert (row, col, full) == (without(spec, d0), without(spec, d1), P(None)), jax.tree_util.keystr(path)
    else:
      assert (row, col, full) == (P(None), P(None), spec), jax.tree_util.keystr(path)
  assert factored >= 4 and state.count.spec == P()


def _at(tree, path):
  return dict(jax.tree_util.tree_flatten_with_path(tree)[0])[path]


@pytest.mark.parametrize("param_shape, leaf_shape, expected", [
    ((4, 8, 16), (4, 8, 16), ("expert", None, "mlp")),
    ((4, 8, 16), (4, 8), ("expert", None)),
    ((4, 8, 16), (4, 16), ("expert", "mlp")),
    ((4, 8, 8), (4, 8), (None, None)),  # which 8 was reduced is ambiguous: replicate
    ((4, 8, 16), (1,), (None,)),
])
def test_leaf_axes(param_shape, leaf_shape, expected):
  assert shardings.leaf_axes(("expert", None, "mlp"), param_shape, leaf_shape) == expected


def test_batch_sharding_follows_the_rules():
  from gshard_mt.parallel.rules import RULES

  mesh = jax.make_mesh((1, 1, 1), ("data", "expert", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
  assert shardings.batch_sharding(mesh, RULES["data"]).spec == P("data", None)
  assert shardings.batch_sharding(mesh, RULES["expert"]).spec == P(("data", "expert"), None)

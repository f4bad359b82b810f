"""Shardings derived from logical axes: parameters, every optimizer-state leaf, the batch."""

import collections

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from gshard_mt.parallel import shardings
from gshard_mt.training.setup import build
from tests.helpers import small_config

MIN_DIM_TO_FACTOR = 128  # optax.adafactor's default


def setup_for(optimizer, table):
  # On one device the PartitionSpecs still name the mesh axes. 'expert' splits E (and the batch); 'expert_model'
  # also gives H, F, heads and V the 'model' axis, so a wrongly derived leaf shows. Dims of 128+ make Adafactor
  # factor its second moments.
  config = small_config(**{"optimizer.name": optimizer, "partitioning": table, "model.emb_dim": 128,
                           "model.mlp_dim": 256, "moe.hidden_dim": 256, "model.head_dim": 64})
  return build(config, 600, devices=jax.devices()[:1])


def params_by_path(setup):
  """{parameter path: (shape, PartitionSpec)}."""
  flat = jax.tree_util.tree_flatten_with_path(setup.abstract_state.params)[0]
  specs = [s.spec for s in jax.tree.leaves(setup.state_shardings.params)]
  return {path: (leaf.shape, spec) for (path, leaf), spec in zip(flat, specs, strict=True)}


def without(spec, dim):
  return P(*[axis for i, axis in enumerate(spec) if i != dim])


def expected_spec(optimizer, field, shape, spec):
  """What a per-parameter optimizer leaf's sharding must be, from the parameter's shape and spec alone."""
  if optimizer == "adam":  # mu and nu: the parameter's shape, so the parameter's spec
    return spec
  # optax.adafactor factors the two largest dims when the smaller of them has at least MIN_DIM_TO_FACTOR: v_row
  # drops the largest (d0), v_col the second largest (d1), and v is a [1] placeholder; otherwise v is full and
  # v_row, v_col are placeholders.
  d1, d0 = np.argsort(shape)[-2:] if len(shape) >= 2 else (None, None)
  if d1 is not None and shape[d1] >= MIN_DIM_TO_FACTOR:
    return {"v_row": without(spec, d0), "v_col": without(spec, d1), "v": P()}[field]
  return {"v_row": P(), "v_col": P(), "v": spec}[field]


def normal(spec):
  """A spec without trailing Nones: P(None) and P() both replicate."""
  axes = list(spec)
  while axes and axes[-1] is None:
    axes.pop()
  return tuple(axes)


@pytest.mark.parametrize("table", ["expert", "expert_model"])
@pytest.mark.parametrize("optimizer", ["adam", "adafactor"])
def test_every_optimizer_leaf_is_sharded_as_its_parameter_implies(optimizer, table):
  setup = setup_for(optimizer, table)
  params = params_by_path(setup)
  shardings_of_state = jax.tree_util.tree_flatten_with_path(setup.state_shardings.opt_state)[0]
  assert len(shardings_of_state) == len(jax.tree.leaves(setup.abstract_state.opt_state))
  fields, factored = collections.Counter(), 0
  for path, sharding in shardings_of_state:
    # A per-parameter leaf's path is [..., field, *parameter path]; counts and the rest are replicated.
    at = next((i for i in range(len(path)) if tuple(path[i + 1:]) in params), None)
    name = jax.tree_util.keystr(path)
    if at is None:
      fields["other"] += 1
      assert normal(sharding.spec) == (), name
      continue
    field = path[at].name
    shape, spec = params[tuple(path[at + 1:])]
    expected = expected_spec(optimizer, field, shape, spec)
    assert normal(sharding.spec) == normal(expected), (name, shape, spec)
    fields[field] += 1
    factored += field == "v_row" and normal(expected) != ()
  per_param = ("mu", "nu") if optimizer == "adam" else ("v_row", "v_col", "v")
  assert fields == {**dict.fromkeys(per_param, len(params)), "other": fields["other"]}
  assert 1 <= fields["other"] <= 3  # the counts of the moments and of the schedule
  split = "model" if table == "expert_model" else "expert"
  assert any(split in str(spec) for _, spec in params.values())  # the test sees split parameters
  if optimizer == "adafactor":
    assert factored >= 4


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

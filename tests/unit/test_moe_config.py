"""MoeConfig: one place for the MoE options, their defaults, choices and checks."""

import dataclasses

import pytest

from gshard_mt import config as config_lib
from gshard_mt.config import Config, defaults
from gshard_mt.config.moe import MoeConfig
from gshard_mt.errors import ConfigError
from gshard_mt.moe import dispatch, experts, grouped
from gshard_mt.training import validate


def test_the_config_files_moe_section_is_exactly_moe_config():
  assert dict(defaults.get_config().moe) == dataclasses.asdict(MoeConfig())
  assert config_lib.parse(defaults.get_config()).moe == MoeConfig()


def test_the_validation_checks_names_against_the_registries_beside_their_classes():
  assert validate.CHOICES["moe.activation"] is experts.ACTIVATIONS
  assert validate.CHOICES["moe.grouped_kernel"] is grouped.GROUPED_KERNELS
  assert validate.CHOICES["moe.dispatch"].allowed is experts.PATHS
  assert experts.PATHS.names() == ("einsum", "index", "index_gather", "grouped", "shard_map")
  assert set(dispatch.DISPATCHERS) | {"shard_map"} == set(experts.PATHS)
  buffers = r"moe.dispatch in \('einsum', 'index', 'index_gather'\), not 'relu' and 'grouped'"
  with pytest.raises(ConfigError, match=buffers):
    validate.check(Config(moe=dataclasses.replace(MoeConfig(), expert_kernel="pallas", dispatch="grouped")))


@pytest.mark.parametrize("change, message", [
    (dict(dispatch="gather"), "moe.dispatch='gather': expected one of"),
    (dict(activation="tanh"), "moe.activation='tanh'"),
    (dict(second_expert_policy="best"), "moe.second_expert_policy='best'"),
    (dict(group_size=0), "moe.group_size=0: expected a positive integer"),
    (dict(num_experts=2.5), "moe.num_experts=2.5: expected an int, got a float"),
    (dict(train_capacity_factor=0.0), "moe.train_capacity_factor=0.0: expected a finite number > 0"),
    (dict(num_experts=1), "moe.num_experts=1: top-2 gating needs at least 2 experts"),
    (dict(grouped_kernel="triton"), "moe.grouped_kernel='triton': expected one of"),
    (dict(grouped_kernel="mosaic_gpu"), "moe.grouped_kernel='mosaic_gpu' is the grouped dispatch's: it needs "
                                        "moe.dispatch='grouped', not 'auto'"),
])
def test_checks_name_the_key(change, message):
  with pytest.raises(ConfigError, match=message):
    validate.check(Config(moe=dataclasses.replace(MoeConfig(), **change)))


def test_a_dense_model_checks_only_the_choices():
  dense = dataclasses.replace(Config(), model=dataclasses.replace(Config().model, moe_interval=0))
  validate.check(dataclasses.replace(dense, moe=MoeConfig(num_experts=1)))  # a combination the MoE layer refuses
  with pytest.raises(ConfigError, match="moe.dispatch='x': expected one of"):
    validate.check(dataclasses.replace(dense, moe=MoeConfig(dispatch="x")))

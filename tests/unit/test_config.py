"""Config files, command-line overrides and validation."""

import types

import pytest

from gshard_mt import config as config_lib
from gshard_mt.errors import ConfigError
from gshard_mt.parallel import mesh as mesh_lib
from tests.helpers import ROOT, small_config

TINY = ROOT / "configs" / "tiny.py"


def test_overrides_are_typed():
  c = config_lib.load(TINY, {"moe.num_experts": "8", "data.temperature": "inf", "model.remat": "true",
                             "optimizer.learning_rate": "1", "data.languages": "fra,deu"})
  assert c.moe.num_experts == 8 and c.data.temperature == float("inf") and c.model.remat is True
  assert c.optimizer.learning_rate == 1.0 and isinstance(c.optimizer.learning_rate, float)
  assert c.data.languages == "fra,deu"


def test_split_overrides():
  rest, overrides = config_lib.split_overrides(
      ["--config", "c.py", "--config.moe.num_experts=4", "--workdir", "w", "--config.seed", "3"])
  assert rest == ["--config", "c.py", "--workdir", "w"]
  assert overrides == {"moe.num_experts": "4", "seed": "3"}


@pytest.mark.parametrize("overrides, message", [
    ({"moe.num_expert": "4"}, "unknown config key 'moe.num_expert'; did you mean moe.num_experts"),
    ({"moe.num_experts": "four"}, "expected a int"),
    ({"model.remat": "maybe"}, "expected true or false"),
    ({"moe.dispatch": "scatter"}, "moe.dispatch='scatter': expected one of"),
    ({"model.num_encoder_layers": "3"}, "not a multiple of model.moe_interval=2"),
    ({"moe.group_size": "100"}, "moe.group_size=100 does not divide the 768 tokens"),
    ({"mesh.expert": "3"}, "moe.num_experts=4 is not divisible by the expert axis, mesh.expert=3"),
    ({"moe.num_experts": "1"}, "at least 2 experts"),
    ({"batch_size": "0"}, "batch_size=0: expected a positive integer"),
    ({"data.temperature": "0.0"}, "data.temperature"),
])
def test_validation_errors(overrides, message):
  with pytest.raises(ConfigError, match=message):
    config_lib.load(TINY, overrides)


def test_mesh_must_match_devices():
  c = config_lib.load(TINY, {"mesh.data": "2", "mesh.expert": "2", "moe.group_size": "64"})
  with pytest.raises(ConfigError, match="= 4 does not match the 8 devices"):
    config_lib.validate(c, num_devices=8)
  config_lib.validate(c, num_devices=4)
  assert mesh_lib.mesh_shape(config_lib.load(TINY, {"mesh.data": "-1", "mesh.expert": "2"}), 8) == (4, 2, 1)
  with pytest.raises(ConfigError, match="mesh.expert=3 x mesh.model=1 does not divide the 8 devices"):
    mesh_lib.mesh_shape(config_lib.load(TINY, {"mesh.expert": "3", "moe.num_experts": "3"}), 8)


def test_dcn_mesh_multiplies_the_slice_mesh():
  c = config_lib.load(TINY, {"dcn_mesh.data": "2", "mesh.expert": "2"})
  assert mesh_lib.ici_shape(c, 8) == (2, 2, 1)
  assert mesh_lib.mesh_shape(c, 8) == (4, 2, 1)
  with pytest.raises(ConfigError, match="dcn_mesh asks for 3 slices, which does not divide the 8"):
    mesh_lib.mesh_shape(config_lib.load(TINY, {"dcn_mesh.data": "3"}), 8)
  with pytest.raises(ConfigError, match="does not match the 2 devices of each of the 2 slices"):
    mesh_lib.mesh_shape(config_lib.load(TINY, {"dcn_mesh.data": "2", "mesh.data": "4"}), 4)
  with pytest.raises(ConfigError, match="not divisible by the expert axis, mesh.expert=2 x dcn_mesh"):
    config_lib.load(TINY, {"dcn_mesh.expert": "3", "mesh.expert": "2", "moe.num_experts": "8"})
  # One process is one slice: asking for two is an error naming both counts.
  devices = [types.SimpleNamespace(process_index=0)] * 2
  with pytest.raises(ConfigError, match="asks for 2 slices, but the 2 devices are on 1 processes"):
    mesh_lib.make_mesh(config_lib.load(TINY, {"dcn_mesh.data": "2"}), devices=devices)


def test_batch_and_groups_must_split_over_the_devices():
  with pytest.raises(ConfigError, match="batch_size=16 does not split over the 32 devices"):
    config_lib.validate(config_lib.load(TINY), num_devices=32)
  with pytest.raises(ConfigError, match="the 3 MoE groups of a batch .* do not split over the 8"):
    config_lib.validate(config_lib.load(TINY), num_devices=8)


def test_saved_config_protects_a_run(tmp_path):
  config_lib.save(small_config(), tmp_path)
  config_lib.save(small_config(**{"num_train_steps": 100}), tmp_path)  # training length may change
  with pytest.raises(ConfigError, match="moe.num_experts: 4 -> 8; use a new --workdir"):
    config_lib.save(small_config(**{"moe.num_experts": 8}), tmp_path)
  assert config_lib.load_saved(tmp_path).moe.num_experts == 4


def test_missing_config_file():
  with pytest.raises(ConfigError, match="not found"):
    config_lib.load(ROOT / "configs" / "nope.py")


def test_config_choices_come_from_the_modules_that_use_them():
  from gshard_mt.model.transformer import EMBEDDING_SCHEMES
  from gshard_mt.parallel.rules import RULES

  assert config_lib.CHOICES["partitioning"] == tuple(RULES)
  assert config_lib.CHOICES["model.embedding"] == tuple(EMBEDDING_SCHEMES)
  assert not any(key.startswith("moe.") for key in config_lib.CHOICES)  # MoeConfig checks its own


def test_moe_keys_are_checked_by_moe_config():
  with pytest.raises(ConfigError, match="moe.dispatch='gather'"):
    config_lib.load(TINY, {"moe.dispatch": "gather"})
  with pytest.raises(ConfigError, match="moe.num_experts=1: top-2 gating needs at least 2 experts"):
    config_lib.load(TINY, {"moe.num_experts": "1", "mesh.expert": "1"})
  config_lib.load(TINY, {"moe.num_experts": "1", "model.moe_interval": "0"})  # a dense model ignores E

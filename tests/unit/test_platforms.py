"""`auto`: each platform's value of the options whose best value differs by platform, resolved where the devices
are known; config.json keeps `auto`, and runs written with explicit values resume."""

import jax.numpy as jnp
import pytest

from gshard_mt import config as config_lib
from gshard_mt import config_files
from gshard_mt.config import platforms
from gshard_mt.errors import ConfigError
from gshard_mt.model.transformer import TransformerConfig
from gshard_mt.training import validate
from tests.helpers import small_config

AUTO = {"model.dropout_rng": "auto", "model.attention": "auto", "model.residual_dtype": "auto", "moe.dispatch": "auto"}


def test_each_platform_gets_its_measured_choices():
  bf16 = AUTO | {"model.dtype": "bfloat16", "model.attention_dropout_rate": 0.0}
  assert platforms.chosen(bf16, "gpu") == {"model.dropout_rng": "threefry", "model.attention": "fused",
                                           "model.residual_dtype": "bfloat16", "moe.dispatch": "index_gather"}
  assert platforms.chosen(bf16, "cuda") == platforms.chosen(bf16, "gpu")
  for platform in ("tpu", "cpu", "something_new"):
    assert platforms.chosen(bf16, platform) == {"model.dropout_rng": "threefry", "model.attention": "xla",
                                                "model.residual_dtype": "float32", "moe.dispatch": "index"}


@pytest.mark.parametrize("settings, reference", [
    ({"model.dtype": "bfloat16", "model.attention_dropout_rate": 0.1}, {"model.attention"}),  # cuDNN: no dropout
    ({"model.dtype": "float32", "model.attention_dropout_rate": 0.0},  # cuDNN takes no float32; the stream stays
     {"model.attention", "model.residual_dtype"})])
def test_a_gpu_keeps_the_reference_where_its_choice_does_not_apply(settings, reference):
  chosen = platforms.chosen(AUTO | settings, "gpu")
  assert chosen == {key: platforms.REFERENCE[key] if key in reference else platforms.BY_PLATFORM["gpu"][key]
                    for key in AUTO}


def test_the_settings_a_choice_depends_on_must_be_given():
  with pytest.raises(KeyError, match="model.dtype"):
    platforms.chosen({"model.attention": "auto", "model.attention_dropout_rate": 0.0}, "gpu")
  assert platforms.chosen({"moe.dispatch": "auto"}, "gpu") == {"moe.dispatch": "index_gather"}


def test_only_auto_is_resolved():
  settings = AUTO | {"model.attention": "fused", "model.dropout_rate": 0.1, "model.dtype": "bfloat16"}
  assert platforms.chosen(settings, "gpu").keys() == {
      "model.dropout_rng", "model.residual_dtype", "moe.dispatch"}


def test_the_model_config_is_resolved_for_the_devices_platform():
  config = small_config()
  assert (config.model.attention, config.model.dropout_rng, config.model.residual_dtype) == ("auto",) * 3
  gpu, cpu = (TransformerConfig.from_config(config, 64, p) for p in ("gpu", "cpu"))
  assert (gpu.model.attention, gpu.model.dropout_rng, gpu.residual_dtype, gpu.moe.dispatch) == (
      "xla", "threefry", jnp.float32, "index_gather")  # small_config computes in float32
  bf16 = TransformerConfig.from_config(small_config(**{"model.dtype": "bfloat16"}), 64, "gpu")
  assert (bf16.model.attention, bf16.residual_dtype) == ("fused", jnp.bfloat16)
  assert (cpu.model.attention, cpu.model.dropout_rng, cpu.residual_dtype, cpu.moe.dispatch) == (
      "xla", "threefry", jnp.float32, "index")
  assert config.moe.dispatch == "auto" and small_config(**{"moe.dispatch": "einsum"}).moe.dispatch == "einsum"
  explicit = small_config(**{"model.attention": "fused", "model.residual_dtype": "bfloat16"})
  assert (TransformerConfig.from_config(explicit, 64, "gpu").model.attention,
          TransformerConfig.from_config(explicit, 64, "cpu").residual_dtype) == ("fused", jnp.bfloat16)


def test_config_json_keeps_auto_and_runs_with_explicit_values_resume(tmp_path):
  config = small_config()
  config_files.save(config, tmp_path)
  assert validate.load_saved(tmp_path).model.attention == "auto"
  old = tmp_path / "old"
  config_files.save(config_lib.replace(config, {"model.attention": "xla", "model.dropout_rng": "threefry"}), old)
  config_files.save(config, old)  # the same run: what auto means on this platform changes no parameter
  with pytest.raises(ConfigError, match="written for a different run: model.emb_dim"):
    config_files.save(config_lib.replace(config, {"model.emb_dim": 64}), old)


def test_auto_is_refused_where_an_option_has_no_platform_value():
  with pytest.raises(ConfigError, match=r"model.remat='auto': expected one of"):
    small_config(**{"model.remat": "auto"})


def test_resolve_gives_the_config_every_auto_option_of_the_platform_in_one_place():
  from gshard_mt.config import Config

  config = Config()
  on_cpu, chosen = platforms.resolve(config, "cpu")
  assert chosen == {"model.dropout_rng": "threefry", "model.attention": "xla", "model.residual_dtype": "float32",
                    "moe.dispatch": "index"}
  assert (on_cpu.model.attention, on_cpu.moe.dispatch, on_cpu.model.emb_dim) == ("xla", "index", config.model.emb_dim)
  on_gpu, _ = platforms.resolve(config, "cuda")
  assert (on_gpu.model.attention, on_gpu.model.residual_dtype, on_gpu.moe.dispatch) == (
      "fused", "bfloat16", "index_gather")
  assert config.moe.dispatch == config.model.attention == "auto"  # the config itself keeps `auto`
  assert platforms.resolve(on_gpu, "cpu") == (on_gpu, {})  # nothing left to resolve

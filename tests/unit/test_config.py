"""Config files, command-line overrides and validation."""

import json
import re

import ml_collections
import pytest

from gshard_mt import cli, config_files
from gshard_mt import config as config_lib
from gshard_mt.config.sections import Config, ModelConfig
from gshard_mt.errors import ConfigError
from gshard_mt.parallel import mesh as mesh_lib
from gshard_mt.training import validate
from tests.helpers import ROOT, small_config, started_as

TINY = ROOT / "configs" / "tiny.py"


def test_overrides_are_typed():
  c = cli.load(TINY, {"moe.num_experts": "8", "data.temperature": "inf", "model.tied_logits": "true",
                      "optimizer.learning_rate": "1", "data.languages": "fra,deu"})
  assert c.moe.num_experts == 8 and c.data.temperature == float("inf") and c.model.tied_logits is True
  assert c.optimizer.learning_rate == 1.0 and isinstance(c.optimizer.learning_rate, float)
  assert c.data.languages == "fra,deu"


def test_an_override_reaches_the_keys_that_refer_to_it_and_leaves_the_file_s_configdict_as_it_was():
  file_config = config_files.load_file(TINY)
  file_config.moe.hidden_dim = file_config.model.get_ref("mlp_dim")  # a config file's field reference
  before = file_config.to_dict()
  c = config_lib.parse(file_config, {"model.mlp_dim": "96", "moe.num_experts": "8"})
  assert (c.model.mlp_dim, c.moe.hidden_dim, c.moe.num_experts) == (96, 96, 8)
  assert file_config.to_dict() == before
  assert config_lib.parse(ml_collections.ConfigDict(before)) == config_lib.parse(file_config)


def test_split_overrides():
  rest, overrides = config_lib.split_overrides(
      ["--config", "c.py", "--config.moe.num_experts=4", "--workdir", "w", "--config.seed", "3"])
  assert rest == ["--config", "c.py", "--workdir", "w"]
  assert overrides == {"moe.num_experts": "4", "seed": "3"}


@pytest.mark.parametrize("overrides, message", [
    ({"moe.num_expert": "4"}, "unknown config key 'moe.num_expert'; did you mean moe.num_experts"),
    ({"moe.num_experts": "four"}, "moe.num_experts=four: expected an int$"),
    ({"moe.num_experts": "4.5"}, "moe.num_experts=4.5: expected an int, got a float$"),
    ({"optimizer.learning_rate": "[1]"}, "optimizer.learning_rate=\\[1\\]: expected a float, got a list$"),
    ({"model.tied_logits": "maybe"}, "expected true or false"),
    ({"model.remat": "true"}, r"model.remat='true': expected one of \('none', 'full', 'dots', 'dots_no_batch'\)"),
    ({"num_microbatches": "3"}, "num_microbatches=3 does not divide batch_size=8"),
    # 2 microbatches of 4 rows: 512 source tokens are 4 groups of 128, but 320 target tokens no whole groups
    ({"num_microbatches": "2"}, r"moe.group_size=128 does not divide the 320 tokens of a microbatch "
                                r"\(batch_size=8 / num_microbatches=2 x data.max_target_length=80\)"),
    ({"moe.dispatch": "scatter"}, "moe.dispatch='scatter': expected one of"),
    ({"model.num_encoder_layers": "3"}, "not a multiple of model.moe_interval=2"),
    ({"model.emb_dim": "33"}, "model.emb_dim=33: sinusoidal positions .* need an even width"),
    ({"moe.group_size": "100"}, r"moe.group_size=100 does not divide the 1024 tokens .*data.max_length=128\)"),
    ({"moe.group_size": "256"}, r"moe.group_size=256 does not divide the 640 tokens .*data.max_target_length=80\)"),
    ({"data.max_target_length": "-1"}, r"data.max_target_length=-1: expected an integer >= 0 \(0 = data.max_length"),
    ({"mesh.expert": "3"}, "moe.num_experts=4 is not divisible by the expert axis, mesh.expert=3"),
    ({"moe.num_experts": "1"}, "at least 2 experts"),
    ({"batch_size": "0"}, "batch_size=0: expected a positive integer"),
    ({"data.temperature": "0.0"}, "data.temperature"),
    ({"optimizer.learning_rate": "nan"}, r"optimizer.learning_rate=nan: expected a finite number > 0"),
    ({"optimizer.learning_rate": "inf"}, r"optimizer.learning_rate=inf: expected a finite number > 0"),
    ({"optimizer.learning_rate": "0"}, r"optimizer.learning_rate=0.0: expected a finite number > 0"),
    ({"optimizer.grad_clip_norm": "-1"}, r"optimizer.grad_clip_norm=-1.0: expected a finite number >= 0"),
    ({"optimizer.label_smoothing": "1"}, r"optimizer.label_smoothing=1.0: expected a finite number in \[0, 1\)"),
    ({"model.dropout_rate": "nan"}, r"model.dropout_rate=nan: expected a finite number in \[0, 1\)"),
    ({"data.character_coverage": "0"}, r"data.character_coverage=0.0: expected a finite number in \(0, 1\]"),
    ({"optimizer.warmup_steps": "-1"}, r"optimizer.warmup_steps=-1: expected an integer >= 0 \(0 = none\)"),
    ({"eval_every": "-5"}, r"eval_every=-5: expected an integer >= 0 \(0 = never\)"),
    ({"moe.z_loss_weight": "inf"}, r"moe.z_loss_weight=inf: expected a finite number >= 0"),
    ({"moe.jitter_noise": "nan"}, r"moe.jitter_noise=nan: expected a finite number >= 0"),
    ({"moe.router_logit_cap": "-1"}, r"moe.router_logit_cap=-1.0: expected a finite number >= 0"),
    # a process layout that would be ignored, each host then training alone
    ({"distributed.coordinator_address": "h0:1234"}, "distributed.coordinator_address given for one process"),
    ({"distributed.num_processes": "2", "distributed.process_id": "5"},
     r"distributed.process_id=5: expected 0 to num_processes - 1 = 1"),
    ({"distributed.auto": "true", "distributed.num_processes": "4"}, "leave distributed.num_processes unset"),
    ({"distributed.num_processes": "0"}, "distributed.num_processes=0: expected a positive integer"),
    ({"model.positions": "learned", "model.max_position": "100"}, r"data.max_length=128 \(data.max_target_length="
                                                                  r"80\) \+ model.position_offset=0 exceeds "
                                                                  r"model.max_position=100"),
])
def test_validation_errors(overrides, message):
  with pytest.raises(ConfigError, match=message):
    cli.load(TINY, overrides)


@pytest.mark.parametrize("overrides, devices, message", [
    # partitioning='expert_model' splits mlp, heads and vocab (the dense FFN's and the experts' hidden units, the
    # heads, the vocabulary) over the model axis: 256 and 4 over 3 and 8 do not
    ({"mesh.model": "3"}, 6, r"model.mlp_dim=256 does not split over the model axis, mesh.model=3 x dcn_mesh.model=1 "
                             r"\(partitioning='expert_model'\)"),
    ({"mesh.model": "8"}, 8, r"model.num_heads=4 does not split over the model axis"),
    # every FFN MoE: the dense FFN's mlp_dim is no parameter, the experts' H is
    ({"mesh.model": "2", "model.moe_interval": "1", "model.mlp_dim": "255", "moe.hidden_dim": "255"}, 2,
     r"moe.hidden_dim=255 does not split"),
])
def test_the_dimensions_the_rules_split_must_divide_their_axes(overrides, devices, message):
  """Derived from the rule table (parallel.rules), checked with the mesh before any data is read."""
  overrides = {"moe.group_size": "16", **overrides}  # groups that split over any of these meshes
  with pytest.raises(ConfigError, match=message):
    mesh_lib.check(cli.load(TINY, {"partitioning": "expert_model", **overrides}), devices)
  mesh_lib.check(cli.load(TINY, overrides), devices)  # 'expert' splits none of them


def test_batch_and_groups_must_split_over_the_devices():
  with pytest.raises(ConfigError, match="batch_size=8 does not split over the 16 devices"):
    mesh_lib.check(cli.load(TINY), 16)
  # 8 rows x 128 source tokens are 8 groups of 128, the 80-token target rows 5
  with pytest.raises(ConfigError, match=r"the 5 MoE groups of a batch \(batch_size x data.max_target_length=80 .* "
                                        "do not split over the 8"):
    mesh_lib.check(cli.load(TINY), 8)
  with pytest.raises(ConfigError, match=r"the 4 MoE groups of a batch \(batch_size x data.max_length=64 .* "
                                        "do not split over the 8"):
    mesh_lib.check(cli.load(TINY, {"data.max_length": "64", "data.max_target_length": "0"}), 8)
  mesh_lib.check(cli.load(TINY, {"moe.group_size": "16"}), 8)  # 64 and 40 groups
  micro = {"moe.group_size": "16", "num_microbatches": "2"}  # 4 rows a microbatch: 32 and 20 groups of 16
  with pytest.raises(ConfigError, match=r"batch_size=8 / num_microbatches=2 does not split over the 8 devices"):
    mesh_lib.check(cli.load(TINY, micro), 8)
  with pytest.raises(ConfigError, match=r"the 5 MoE groups of a microbatch \(batch_size / num_microbatches x "
                                        r"data.max_target_length=80 / moe.group_size\) do not split over the 4"):
    mesh_lib.check(cli.load(TINY, {**micro, "moe.group_size": "64"}), 4)
  mesh_lib.check(cli.load(TINY, micro), 4)


def test_remat_true_and_false_of_older_runs_are_full_and_none(tmp_path):
  old = json.loads(json.dumps(config_lib.to_dict(small_config())))
  old["model"]["remat"] = False  # as runs before the remat policies saved it
  (tmp_path / "config.json").write_text(json.dumps(old))
  assert validate.load_saved(tmp_path).model.remat == "none"
  config_files.save(small_config(**{"model.remat": "dots"}), tmp_path)  # the policy changes no result: resumes
  old["model"]["remat"] = True
  (tmp_path / "config.json").write_text(json.dumps(old))
  assert validate.load_saved(tmp_path).model.remat == "full"


def test_saved_config_protects_a_run(tmp_path):
  config_files.save(small_config(), tmp_path)
  config_files.save(small_config(**{"num_train_steps": 100}), tmp_path)  # training length may change
  config_files.save(small_config(**{"model.scan_unroll": 2}), tmp_path)  # the parameters stay as they are
  config_files.save(small_config(**{"moe.expert_kernel": "pallas", "moe.eval_capacity_factor": 3.0}), tmp_path)
  with pytest.raises(ConfigError, match="moe.aux_loss_weight: 0.01 -> 0.1"):  # the objective is the run's
    config_files.save(small_config(**{"moe.aux_loss_weight": 0.1}), tmp_path)
  with pytest.raises(ConfigError, match="moe.num_experts: 4 -> 8; to train this config, use a new work directory: "):
    config_files.save(small_config(**{"moe.num_experts": 8}), tmp_path)
  assert validate.load_saved(tmp_path).moe.num_experts == 4


def test_a_key_added_since_a_run_started_resumes_at_its_default(tmp_path):
  """A config.json written before data.max_target_length existed: the run had its default's behaviour."""
  old = json.loads(json.dumps(config_lib.to_dict(small_config())))
  del old["data"]["max_target_length"]
  (tmp_path / "config.json").write_text(json.dumps(old))
  config_files.save(small_config(), tmp_path)  # 0, the default: the same run
  (tmp_path / "config.json").write_text(json.dumps(old))
  with pytest.raises(ConfigError, match="data.max_target_length: 0 -> 16; to train this config, use a new work "):
    config_files.save(small_config(**{"data.max_target_length": 16}), tmp_path)


@pytest.mark.parametrize("text, line, error", [
    ("def get_config():\n  return 1 / 0\n", 2, "ZeroDivisionError: division by zero"),  # in get_config()
    ("import math\nSCALE = math.sqrt(-1)\n", 2, "ValueError: math domain error"),  # as the file is run
    ("def get_config(:\n  pass\n", 1, "SyntaxError: "),
    ("import ml_collections\n\ndef get_config():\n  return ml_collections.ConfigDict().nope\n", 4,
     "AttributeError: "),  # raised in another module, at this file's line
])
def test_a_config_file_that_raises_is_one_line_naming_its_line(tmp_path, text, line, error):
  path = tmp_path / "broken.py"
  path.write_text(text)
  with pytest.raises(ConfigError) as raised:
    cli.load(path)
  assert str(raised.value).startswith(f"{path}:{line}: {error}") and "\n" not in str(raised.value)


def test_missing_config_file():
  with pytest.raises(ConfigError, match="not found"):
    cli.load(ROOT / "configs" / "nope.py")


def test_config_choices_come_from_the_modules_that_use_them():
  from gshard_mt.model.transformer import EMBEDDING_SCHEMES
  from gshard_mt.parallel.rules import RULES
  from gshard_mt.training import validate

  assert validate.CHOICES["partitioning"] is RULES and tuple(RULES) == ("data", "expert", "expert_model")
  assert validate.CHOICES["model.embedding"] is EMBEDDING_SCHEMES and "vaswani" in EMBEDDING_SCHEMES
  assert "partitioning" not in Config.CHOICES and "embedding" not in ModelConfig.CHOICES  # the config is a leaf


def test_moe_keys_are_checked_by_moe_config():
  with pytest.raises(ConfigError, match="moe.dispatch='gather'"):
    cli.load(TINY, {"moe.dispatch": "gather"})
  with pytest.raises(ConfigError, match="moe.num_experts=1: top-2 gating needs at least 2 experts"):
    cli.load(TINY, {"moe.num_experts": "1", "mesh.expert": "1"})
  cli.load(TINY, {"moe.num_experts": "1", "model.moe_interval": "0"})  # a dense model ignores E


@pytest.mark.parametrize("values, message", [
    ({"dcn_mesh": {"data": 1.5}}, "dcn_mesh.data=1.5: expected an int, got a float"),
    ({"moe": {"jitter_noise": "x"}}, "moe.jitter_noise='x': expected a float, got a str"),
    ({"model": {"scan_layers": 1}}, "model.scan_layers=1: expected a bool, got an int"),
    ({"batch_size": True}, "batch_size=True: expected an int, got a bool"),
    ({"data": {"surce": "tsv"}}, "unknown config key 'data.surce'; did you mean source"),
])
def test_parse_names_the_key_of_a_wrong_type_or_name(values, message):
  with pytest.raises(ConfigError, match=re.escape(message)):
    config_lib.parse(values)
  assert config_lib.parse({"data": {"temperature": 2}}).data.temperature == 2.0  # an int is a float


def test_a_section_given_a_value_and_an_unreadable_config_json_are_one_line(tmp_path):
  with pytest.raises(ConfigError, match=r"--config.moe=3: moe is a section; set its keys, e.g. --config.moe\."):
    small_config(**{"moe": 3})
  (tmp_path / "config.json").write_text('{"moe": {\n')
  with pytest.raises(ConfigError, match=r"config.json:2: not valid JSON \(.*\); the run's config cannot be read"):
    validate.load_saved(tmp_path)


def test_a_bad_value_of_a_run_s_config_json_names_the_file(tmp_path):
  values = config_lib.to_dict(small_config())
  values["moe"]["jitter_noise"] = "x"
  (tmp_path / "config.json").write_text(json.dumps(values))
  with pytest.raises(ConfigError) as raised:
    validate.load_saved(tmp_path)
  assert str(raised.value) == (f"{tmp_path}/config.json: moe.jitter_noise='x': expected a float, got a str (in the "
                               "run's saved config)")


def test_a_run_s_config_json_is_validated_like_a_config_file_naming_the_file(tmp_path):
  """Names and combinations (`validate.check`), not only each value: what eval.py, translate.py and init_from read."""
  values = config_lib.to_dict(small_config())
  values["moe"]["router"] = "gshrad"
  (tmp_path / "config.json").write_text(json.dumps(values))
  with pytest.raises(ConfigError, match=re.escape(f"{tmp_path}/config.json: moe.router='gshrad': expected one of")):
    validate.load_saved(tmp_path)
  assert config_files.load_saved(tmp_path).moe.router == "gshrad"  # parsed alone: each value is of its type


@pytest.mark.parametrize("make, command", [
    (True, "make sweep SWEEP=configs/sweeps/routers.py"),
    (False, "python -m gshard_mt.tools.sweep --sweep configs/sweeps/routers.py")])
def test_a_sweep_given_as_a_config_says_how_to_run_it(make, command, monkeypatch):
  monkeypatch.chdir(ROOT)
  started_as(monkeypatch, ["python", "train.py", "--config", "configs/sweeps/routers.py"], make=make)
  with pytest.raises(ConfigError) as raised:
    cli.load("configs/sweeps/routers.py")
  assert str(raised.value) == ("configs/sweeps/routers.py has no get_config: it is a sweep (get_sweep); run it with "
                               + command)


def test_a_config_given_as_a_sweep_says_how_to_train_it(monkeypatch):
  monkeypatch.chdir(ROOT)
  started_as(monkeypatch, ["python", "-m", "gshard_mt.tools.sweep", "--sweep", "configs/multi30k.py"], make=True)
  with pytest.raises(ConfigError, match=re.escape("configs/multi30k.py has no get_sweep: it is a config; train it "
                                                  "with make train CONFIG=configs/multi30k.py WORKDIR=runs/multi30k")):
    config_files.load_module("configs/multi30k.py", "get_sweep")

"""NLLB-200 (M2M100) and NLLB-MoE (NllbMoe) checkpoints in and out, against transformers 4.57.1's own outputs: the
committed fixtures of tools/hf_fixtures.py (tests/fixtures/hf; made by hand with torch, which the tests never
import). With padding in the batch: the encoder's output and the logits equal to 1e-5, greedy decoding with the
forced first token identical to `generate`, import -> export -> import bit-exact, and the refusals."""

import json
import pathlib

import jax
import numpy as np
import pytest
from flax import traverse_util

from gshard_mt import config as config_lib
from gshard_mt.errors import UserError
from gshard_mt.evaluation import evaluate
from gshard_mt.hf import configs, convert, safetensors
from gshard_mt.model import decode
from gshard_mt.model.transformer import Transformer
from gshard_mt.tools import export_hf, import_hf

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf"
KINDS = ("m2m100", "nllb_moe")


@pytest.fixture(scope="module", params=KINDS)
def imported(request, tmp_path_factory):
  """(fixture directory, the work directory imported from it, its reference arrays)."""
  workdir = tmp_path_factory.mktemp(request.param) / "run"
  import_hf.main(["--from", str(FIXTURES / request.param), "--workdir", str(workdir)])
  return FIXTURES / request.param, workdir, dict(np.load(FIXTURES / request.param / "reference.npz"))


def restored(workdir):
  config, tokenizer, setup = convert.run_setup(workdir)
  return config, tokenizer, setup, evaluate.restore_state(workdir, setup.abstract_target(), None)[1].params


def model_batch(ref: dict) -> dict:
  """The reference batch in this model's form: one pair per row, segment 1 on real tokens, positions from 0."""
  batch = {}
  for side, ids, mask in (("inputs", "input_ids", "attention_mask"), ("targets", "labels", "decoder_attention_mask")):
    m = ref[mask].astype(np.int32)
    batch |= {side: ref[ids].astype(np.int32) * m, f"{side}_segmentation": m,
              f"{side}_position": (np.cumsum(m, 1) - 1) * m}
  return batch


def test_logits_equal_transformers(imported):
  _, workdir, ref = imported
  _, _, setup, params = restored(workdir)
  model, batch = Transformer(setup.model_cfg), model_batch(ref)
  memory, _ = model.apply({"params": params}, batch["inputs"], batch["inputs_segmentation"], batch["inputs_position"],
                          method=Transformer.encode)
  real = ref["attention_mask"].astype(bool)
  np.testing.assert_allclose(np.asarray(memory)[real], ref["encoder_last_hidden_state"][real], atol=1e-5)
  logits, _ = model.apply({"params": params}, batch)
  real = ref["decoder_attention_mask"].astype(bool)
  assert np.abs(np.asarray(logits)[real] - ref["logits"][real]).max() < 1e-5


def test_greedy_equals_generate(imported):
  """transformers' generate(num_beams=1, forced_bos_token_id=eng_Latn): its first token is the start (</s>), then
  the forced code; rows that finished are padded."""
  _, workdir, ref = imported
  _, tokenizer, setup, params = restored(workdir)
  steps = ref["greedy"].shape[1] - 1
  translator = decode.Translator(setup.model_cfg, params, beam_size=1, max_len=steps, ids=tokenizer.ids,
                                 forced=tokenizer.forced("eng_Latn"))
  np.testing.assert_array_equal(translator(model_batch(ref)), ref["greedy"][:, 1:])


def test_export_is_the_checkpoint_and_imports_back_bit_exact(imported, tmp_path):
  fixture, workdir, _ = imported
  export_hf.main(["--workdir", str(workdir), "--out", str(tmp_path / "hf")])
  theirs, ours = safetensors.open(fixture), safetensors.open(tmp_path / "hf")
  assert sorted(ours.names()) == sorted(theirs.names())
  for name in theirs.names():
    np.testing.assert_array_equal(ours.tensor(name), theirs.tensor(name), err_msg=name)
  exported = json.loads((tmp_path / "hf" / "config.json").read_text())
  original = json.loads((fixture / "config.json").read_text())
  assert configs.overrides(exported, "x") == configs.overrides(original, "x")
  import_hf.main(["--from", str(tmp_path / "hf"), "--workdir", str(tmp_path / "again")])
  first, again = (traverse_util.flatten_dict(jax.device_get(restored(w)[3])) for w in (workdir, tmp_path / "again"))
  for path, value in first.items():
    np.testing.assert_array_equal(again[path], value, err_msg="/".join(path))


@pytest.mark.parametrize("key,value,message", [
    ("model_type", "bart", "model_type='bart' is not one this project reads"),
    ("activation_function", "gelu", "activation_function='gelu' is not supported"),
    ("decoder_ffn_dim", 64, "encoder_ffn_dim=32 and decoder_ffn_dim=64 differ"),
])
def test_unsupported_checkpoints_are_one_line(key, value, message):
  hf = json.loads((FIXTURES / "m2m100" / "config.json").read_text()) | {key: value}
  with pytest.raises(UserError, match=message) as error:
    configs.overrides(hf, "config.json")
  assert "\n" not in str(error.value)


@pytest.mark.parametrize("override,message", [
    ({"model.layer_norm_epsilon": 1e-6}, r"model.layer_norm_epsilon=1e-06: expected 1e-05"),
    ({"model.positions": "learned"}, "model.positions='learned'"),
    ({"moe.shared_experts": 1}, "moe.shared_experts=1"),
    ({"moe.router": "switch"}, "moe.router='switch'"),
])
def test_what_transformers_cannot_express_is_refused(imported, override, message):
  _, workdir, _ = imported
  config, tokenizer, setup, _ = restored(workdir)
  if override.keys() & {"moe.shared_experts", "moe.router"} and not config.model.moe_interval:
    pytest.skip("a MoE option")
  with pytest.raises(UserError, match=message):
    configs.hf_config(config_lib.replace(config, override), setup.model_cfg.model.vocab_size, tokenizer.ids, 0, 64)


def test_the_export_keeps_every_second_choice_as_this_model_evaluates(imported):
  """'random' drops second choices in training only here; NllbMoe's router draws it in evaluation too, so an
  export writes 'all', which computes what this model evaluates."""
  _, workdir, _ = imported
  config, tokenizer, setup, _ = restored(workdir)
  if not config.model.moe_interval:
    pytest.skip("a MoE option")
  for policy in ("random", "all"):
    hf = configs.hf_config(config_lib.replace(config, {"moe.second_expert_policy": policy,
                                                       "moe.second_expert_threshold": 0.3}),
                           setup.model_cfg.model.vocab_size, tokenizer.ids, 0, 64)
    assert hf["second_expert_policy"] == "all"

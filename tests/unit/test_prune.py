"""Language-specific pruning of token-level routers (tools/extract --keep): the experts kept by usage, and a pruned
model that keeps every expert its language asks for computes what the full model does."""

import json

import jax
import numpy as np
import pytest
from flax import traverse_util

from gshard_mt.data import pipeline
from gshard_mt.evaluation import evaluate
from gshard_mt.model import decode
from gshard_mt.model.transformer import Transformer
from gshard_mt.tools import extract
from tests.unit.test_extract import decode_batch, random_run


def test_usage_kept_takes_the_most_used_experts_as_many_as_the_neediest_layer():
  params = {"encoder": {"units": {"layer_1": {"moe": {"wg": np.zeros((2, 3, 5))}}}},
            "decoder": {"unit_0": {"layer_1": {"moe": {"wg": np.zeros((3, 5))}}}}}
  counts = {"encoder_0": np.array([0, 90, 0, 10, 0]), "encoder_1": np.array([40, 0, 30, 20, 10]),
            "decoder_0": np.array([5, 5, 5, 80, 5])}
  count, kept = extract.usage_kept(params, counts, 0.9, k=2)
  assert count == 3  # encoder_1 needs 40 + 30 + 20
  np.testing.assert_array_equal(kept[0], [0, 1, 3])  # the decoder's path sorts first: 3, then ties to the lower ids
  np.testing.assert_array_equal(kept[1], [[0, 1, 3], [0, 2, 3]])
  assert extract.usage_kept(params, counts, 0.5, k=2)[0] == 2  # at least k


def constant_router_input(params):
  """Every MoE layer's pre-FFN layer norm with scale 0: its router reads the norm's bias, the same for every token,
  so all tokens of a layer ask for the same k experts."""
  flat = traverse_util.flatten_dict(params)
  return traverse_util.unflatten_dict({path: v * 0 if path[-2:] == ("pre_ffn", "scale") and
                                       path[:-2] + ("moe", "wg") in flat else v for path, v in flat.items()})


def teacher_forced_logits(run, pairs):
  tokens = run.data.tokens["dev"]
  batch = next(pipeline.eval_batches(tokens, len(pairs), run.config.data.max_length, pairs))
  batch.pop("index")
  logits, _ = jax.jit(Transformer(run.model_cfg, deterministic=True).apply)({"params": run.params}, batch)
  return np.asarray(logits) * (batch["targets_segmentation"] > 0)[..., None]


def test_a_pruned_gshard_model_that_keeps_every_expert_asked_for_equals_the_full_one(tmp_path, tokenizer_dir):
  """GShard's top-2 gates are normalised over the two chosen, so leaving out experts no token chose changes no
  output; with capacity to spare, the teacher-forced logits and the greedy translations are the same."""
  run = random_run(tmp_path / "run", tokenizer_dir, constant_router_input,
                   **{"moe.router": "gshard", "moe.eval_capacity_factor": 4.0})
  extract.main(["--workdir", str(run), "--languages", "fra", "--keep", "1.0"])
  pruned_dir = tmp_path / "run-fra-1"
  info = json.loads((pruned_dir / "extracted.json").read_text())
  assert info["num_experts"] == 2 and set(info["carried"].values()) == {1.0}
  full, pruned = evaluate.restore(run), evaluate.restore(pruned_dir)
  assert pruned.model_cfg.moe.num_experts == 2
  tokens = full.data.tokens["dev"]
  pairs = pipeline.language_ids(tokens, "fra")[:4]
  np.testing.assert_allclose(teacher_forced_logits(pruned, pairs), teacher_forced_logits(full, pairs), atol=1e-5)
  batch = decode_batch(tokens, pairs)
  outputs = [decode.Translator(r.model_cfg, r.params, beam_size=1, max_len=12)(batch) for r in (full, pruned)]
  np.testing.assert_array_equal(outputs[0], outputs[1])


@pytest.mark.parametrize("router", ["switch", "topk"])
def test_switch_and_topk_models_are_pruned_to_their_languages_experts(tmp_path, tokenizer_dir, router):
  run = random_run(tmp_path / "run", tokenizer_dir, **{"moe.router": router, "moe.num_selected": 1})
  extract.main(["--workdir", str(run), "--languages", "deu", "--keep", "0.6"])
  info = json.loads((tmp_path / "run-deu-0.6" / "extracted.json").read_text())
  usage = json.loads((run / "expert_usage" / "dev-1" / "expert_usage.json").read_text())
  needs = []
  for layer in ("encoder_0", "decoder_0"):
    asked = np.array(usage["counts"][layer]["deu"][0])
    top = sorted(asked, reverse=True)
    needs.append(next(n for n in range(1, 5) if sum(top[:n]) >= 0.6 * asked.sum()))
    kept = info["kept"][layer.replace("_0", "/units/layer_1/moe")][0]
    assert info["carried"][layer] == pytest.approx(asked[kept].sum() / asked.sum(), abs=1e-4)
    assert info["carried"][layer] >= 0.6
  assert info["num_experts"] == max(needs)
  assert evaluate.restore(tmp_path / "run-deu-0.6").model_cfg.moe.num_experts == max(needs)

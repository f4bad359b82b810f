"""Expert use by language (gshard_mt.evaluation.expert_usage, tools/expert_usage): the statistics on routings of
known structure, the counts against a plain loop over tokens, and the command on a small random model."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.config import row_lengths
from gshard_mt.config.moe import MoeConfig
from gshard_mt.data import pipeline
from gshard_mt.evaluation import evaluate
from gshard_mt.evaluation import expert_usage as usage
from gshard_mt.moe.layer import ROUTING, MoeFeedForward
from gshard_mt.tools import expert_usage as tool
from tests.unit.test_extract import random_run


def test_routing_forced_by_language_gives_a_mutual_information_of_one():
  own = np.kron(np.eye(4), np.ones(2)) * 500  # 4 languages, experts 2l and 2l + 1 each: the expert tells the language
  assert usage.normalized_mutual_information(own) == pytest.approx(1.0)
  fixed = np.eye(4)[np.arange(112) % 4] * 37  # 112 languages over 4 experts, one each: the language tells the expert
  assert usage.normalized_mutual_information(fixed) == pytest.approx(1.0)
  half = np.array([[50, 50, 0, 0], [0, 0, 50, 50], [25, 25, 25, 25]])
  assert 0.2 < usage.normalized_mutual_information(half) < 0.8


def test_random_uniform_routing_gives_a_mutual_information_near_zero():
  rng = np.random.default_rng(0)
  counts = np.stack([np.bincount(rng.integers(0, 8, 20000), minlength=8) for _ in range(20)])
  assert usage.normalized_mutual_information(counts) < 0.005
  assert usage.normalized_mutual_information(np.ones((5, 8))) == 0.0  # exactly alike
  np.testing.assert_allclose(usage.entropy(usage.shares(counts)), 3.0, atol=0.01)  # log2(8) bits


def test_experts_for_a_share():
  counts = np.array([[50, 30, 15, 5], [0, 0, 0, 0], [100, 0, 0, 0], [25, 25, 25, 25]])
  np.testing.assert_array_equal(usage.experts_for_share(counts, 0.9), [3, 0, 1, 4])
  np.testing.assert_array_equal(usage.experts_for_share(counts, 0.8), [2, 0, 1, 4])  # 80 of 100 reached exactly
  np.testing.assert_array_equal(usage.experts_carrying(np.array([5, 50, 15, 30]), 0.9), [1, 2, 3])
  np.testing.assert_array_equal(usage.experts_carrying(np.array([3, 3, 3, 1]), 0.5), [0, 1])  # ties: lower ids


def test_jensen_shannon_distances():
  p = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
  d = usage.js_distances(p)
  np.testing.assert_allclose(np.diag(d), 0.0, atol=1e-12)
  assert d[0, 1] == pytest.approx(1.0) and d[0, 2] == pytest.approx(d[1, 2]) and 0 < d[0, 2] < 1
  two_layers = usage.js_distances(np.concatenate([p, p[[0, 0, 0]]], 1))  # the second layer: all alike
  assert two_layers[0, 1] == pytest.approx(np.sqrt(0.5))


def test_assignment_counts_equal_a_plain_loop_over_tokens():
  rng = np.random.default_rng(1)
  U, G, S, K, E = 2, 3, 5, 2, 4
  experts, kept, mask = rng.integers(0, E, (U, G, S, K)), rng.random((U, G, S, K)) < 0.7, rng.random((U, G, S)) < 0.8
  want = np.zeros((U, 2, E), int)
  for u, g, s, k in np.ndindex(U, G, S, K):
    if mask[u, g, s]:
      want[u, 0, experts[u, g, s, k]] += 1
      want[u, 1, experts[u, g, s, k]] += kept[u, g, s, k]
  got = usage.assignment_counts(jnp.asarray(experts), jnp.asarray(kept), jnp.asarray(mask), E)
  np.testing.assert_array_equal(got, want)


def test_the_command_counts_every_real_token_of_each_language(tmp_path, tokenizer_dir):
  """Top-2 at an evaluation capacity: each real token asks 2 experts in every MoE layer; the counts of a language
  are those of its pairs that fit the rows, and the files are written."""
  run = random_run(tmp_path / "run", tokenizer_dir, **{"model.num_encoder_layers": 4, "moe.router": "gshard"})
  result = tool.measure(run, "dev", max_pairs=20)
  restored = evaluate.restore(run)
  tokens = restored.data.tokens["dev"]
  lengths = row_lengths(restored.config)
  fits = pipeline.eligible(tokens, lengths).ids
  assert sorted(result["layers"]) == ["decoder_0", "encoder_0", "encoder_1"]
  for lang in result["languages"]:
    ids = fits[tokens.lang[fits] == tokens.languages.index(lang)][:20]
    for layer, side_len in (("encoder_1", tokens.src_len), ("decoder_0", tokens.tgt_len)):
      asked, kept = np.array(result["counts"][layer][lang])
      assert asked.sum() == 2 * side_len[ids].sum(), (layer, lang)
      assert (kept <= asked).all()
  assert 0.0 <= result["layers"]["encoder_0"]["nmi"] <= 1.0
  out = tool.output_dir(run, "dev", 1)
  assert json.loads((out / "expert_usage.json").read_text())["order"] == result["order"]
  assert "| encoder_0 |" in (out / "report.md").read_text()
  assert (out / "heatmaps.png").exists() and (out / "similarity.png").exists()


def test_the_layer_writes_its_routing_only_where_asked_and_never_at_initialisation():
  layer = MoeFeedForward(MoeConfig(num_experts=4, hidden_dim=8, group_size=8, dispatch="index"))
  x = jnp.ones((2, 4, 6))
  variables = layer.init(jax.random.key(0), x)
  assert set(variables) == {"params"}  # init makes every collection mutable: the routing stays out
  _, written = layer.apply(variables, x, mutable=[ROUTING])
  assert {k: v.shape for k, v in written[ROUTING].items()} == {"expert_index": (1, 8, 2), "kept": (1, 8, 2),
                                                               "mask": (1, 8)}
  assert layer.apply(variables, x)[0].shape == x.shape  # not asked: nothing written, nothing to return


def test_layer_counts_name_the_moe_layers_of_scanned_and_looped_stacks_in_order():
  def routing(expert, kept=True):  # the 2 real tokens of a group of 3 ask `expert` first, then expert 0
    return {"expert_index": jnp.array([[[expert, 0]] * 3]), "kept": jnp.array([[[True, kept]] * 3]),
            "mask": jnp.array([[True, True, False]])}

  looped = {f"unit_{u}": {"layer_1": {"moe": routing(e)}} for u, e in ((0, 1), (2, 2), (10, 3))}
  scanned = {"units": {"layer_1": {"moe": jax.tree.map(lambda *a: jnp.stack(a), routing(2, False), routing(3))}}}
  counts = usage.layer_counts({"encoder": looped, "decoder": scanned}, 4, {"encoder": False, "decoder": False})
  assert list(counts) == ["encoder_0", "encoder_1", "encoder_2", "decoder_0", "decoder_1"]
  for layer, expert in (("encoder_0", 1), ("encoder_1", 2), ("encoder_2", 3), ("decoder_1", 3)):  # unit 10 last
    np.testing.assert_array_equal(counts[layer], [np.eye(4)[0] * 2 + np.eye(4)[expert] * 2] * 2)
  np.testing.assert_array_equal(counts["decoder_0"], [[2, 0, 2, 0], [0, 0, 2, 0]])  # second choices dropped
  chosen_by_experts = usage.layer_counts({"decoder": scanned}, 4, {"encoder": False, "decoder": True})
  np.testing.assert_array_equal(chosen_by_experts["decoder_0"], [[0, 0, 2, 0], [0, 0, 2, 0]])  # asked = kept

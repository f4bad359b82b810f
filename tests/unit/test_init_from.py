"""init_from (gshard_mt/training/init_from.py): sparse upcycling of a dense run (every expert a copy of the dense
FFN, the router fresh) and fine-tuning from a run of the same architecture; at step 0 an upcycled model whose
capacity drops nothing computes its dense parent's logits and greedy translations."""

import shutil

import jax
import numpy as np
import pytest

from gshard_mt import config_files
from gshard_mt.data import pipeline
from gshard_mt.errors import WorkdirError
from gshard_mt.evaluation import evaluate
from gshard_mt.model import decode
from gshard_mt.model.transformer import Transformer
from gshard_mt.training import init_from, loop
from tests.helpers import small_config
from tests.unit.test_extract import decode_batch

rng = np.random.default_rng(0)


def dense_tree(layers=4, M=3, F=5):
  """A dense stack scanned one layer a unit: [layers, ...] leaves."""
  return {"encoder": {"units": {"layer_0": {"ffn": {"wi": rng.normal(size=(layers, M, F)),
                                                    "wo": rng.normal(size=(layers, F, M))},
                                            "attn": {"w": rng.normal(size=(layers, M, M))}}},
                      "final_norm": {"scale": rng.normal(size=(M,))}},
          "embed": {"embedding": rng.normal(size=(7, M))}}


def moe_tree(units=2, M=3, H=5, E=4, F=5):
  """The MoE model of `dense_tree`: units of two layers, the second MoE (experts of width H, the FFN's F)."""
  return {"encoder": {"units": {"layer_0": {"ffn": {"wi": np.zeros((units, M, F)), "wo": np.zeros((units, F, M))},
                                            "attn": {"w": np.zeros((units, M, M))}},
                                "layer_1": {"moe": {"wi": np.zeros((units, E, M, H)), "wo": np.zeros((units, E, H, M)),
                                                    "wg": np.full((units, M, E), 0.5)},
                                            "attn": {"w": np.zeros((units, M, M))}}},
                      "final_norm": {"scale": np.zeros((M,))}},
          "embed": {"embedding": np.zeros((7, M))}}


def test_every_expert_starts_as_the_dense_ffn_it_replaces_and_the_router_fresh():
  dense = dense_tree()
  up = init_from.initial_params(dense, moe_tree(), name="dense")
  ffn, moe = dense["encoder"]["units"]["layer_0"]["ffn"], up["encoder"]["units"]["layer_1"]["moe"]
  for u in range(2):  # layer 2u is unit u's dense layer, 2u + 1 its MoE layer
    np.testing.assert_array_equal(up["encoder"]["units"]["layer_0"]["ffn"]["wi"][u], ffn["wi"][2 * u])
    for e in range(4):
      np.testing.assert_array_equal(moe["wi"][u, e], ffn["wi"][2 * u + 1])
      np.testing.assert_array_equal(moe["wo"][u, e], ffn["wo"][2 * u + 1])
  np.testing.assert_array_equal(up["encoder"]["units"]["layer_1"]["attn"]["w"][1],
                                dense["encoder"]["units"]["layer_0"]["attn"]["w"][3])
  np.testing.assert_array_equal(moe["wg"], 0.5)  # the target's own (fresh) router
  np.testing.assert_array_equal(up["embed"]["embedding"], dense["embed"]["embedding"])
  noisy = init_from.initial_params(dense, moe_tree(), name="dense", noise=0.1)["encoder"]["units"]["layer_1"]["moe"]
  assert not np.array_equal(noisy["wi"][0, 0], noisy["wi"][0, 1])
  assert np.abs(noisy["wi"][0] - ffn["wi"][1]).max() < np.abs(ffn["wi"][1]).max()


def test_the_same_architecture_is_copied_whole():
  moe = moe_tree()
  moe["encoder"]["units"]["layer_1"]["moe"]["wg"] = rng.normal(size=(2, 3, 4))
  copied = init_from.initial_params(moe, moe_tree(), name="moe")
  jax.tree.map(np.testing.assert_array_equal, copied, moe)


@pytest.mark.parametrize("target, message", [
    (moe_tree(H=6), r"the dense FFN ffn/wi of dense's encoder layer 1 is \[3, 5\], this model's experts \[3, 6\]"),
    (moe_tree(units=1), "dense's encoder has 4 layers, this model's 2"),
])
def test_mismatched_widths_and_layers_are_refused_in_one_line(target, message):
  with pytest.raises(WorkdirError, match=message):
    init_from.initial_params(dense_tree(), target, name="dense")


def test_a_layer_with_no_dense_ffn_to_copy_is_refused():
  with pytest.raises(WorkdirError, match="encoder layer 1 has no dense FFN to copy into this model's experts"):
    init_from.initial_params(moe_tree(E=2), moe_tree(E=4), name="moe")


@pytest.mark.slow
def test_an_upcycled_model_at_step_0_computes_its_dense_parent(tmp_path, tokenizer_dir):
  """Top-2 gates normalised to 1, each expert the same FFN, and an evaluation capacity of S (factor 2.0, E = 4,
  k = 2): the logits and the greedy dev translations of step 0 are the dense model's."""
  for name in ("dense", "up"):
    shutil.copytree(tokenizer_dir, tmp_path / name / "tokenizer")
  dense_cfg = small_config(num_train_steps=2, **{"model.moe_interval": 0})
  loop.train_and_evaluate(dense_cfg, tmp_path / "dense")
  loop.train_and_evaluate(small_config(num_train_steps=1, init_from=str(tmp_path / "dense")), tmp_path / "up")
  dense, up = evaluate.restore(tmp_path / "dense"), evaluate.restore(tmp_path / "up", step=0)
  assert up.model_cfg.model.moe_interval and not dense.model_cfg.model.moe_interval
  tokens = dense.data.tokens["dev"]
  pairs = np.arange(8)
  batch = next(pipeline.eval_batches(tokens, 8, dense.config.data.max_length, pairs))
  batch.pop("index")
  real = (batch["targets_segmentation"] > 0)[..., None]  # padding: the MoE layer dispatches none of it
  assert real.mean() < 1
  logits = [np.asarray(jax.jit(Transformer(r.model_cfg).apply)({"params": r.params}, batch)[0]) * real
            for r in (dense, up)]
  np.testing.assert_allclose(logits[1], logits[0], atol=1e-4, rtol=1e-4)
  greedy = [decode.Translator(r.model_cfg, r.params, beam_size=1, max_len=16)(decode_batch(tokens, pairs))
            for r in (dense, up)]
  np.testing.assert_array_equal(greedy[1], greedy[0])
  assert evaluate.restore(tmp_path / "up").step == 1  # and it trains on from there


def test_layers_are_matched_by_index_between_scanned_and_looped_stacks():
  dense = dense_tree()
  scanned = moe_tree()["encoder"]["units"]
  looped = {"encoder": {f"unit_{u}": jax.tree.map(lambda a, u=u: a[u], scanned) for u in range(2)},
            "embed": {"embedding": np.zeros((7, 3))}}
  looped["encoder"]["final_norm"] = {"scale": np.zeros(3)}
  up = init_from.initial_params(dense, looped, name="dense")
  ffn = dense["encoder"]["units"]["layer_0"]["ffn"]
  np.testing.assert_array_equal(up["encoder"]["unit_1"]["layer_0"]["ffn"]["wi"], ffn["wi"][2])
  np.testing.assert_array_equal(up["encoder"]["unit_1"]["layer_1"]["moe"]["wo"][3], ffn["wo"][3])


def with_biases(tree, layer, path, F=5, M=3):
  """`tree` with biases bi, bo beside the weights at `path` of encoder unit layer `layer` (zeros in a MoE)."""
  holder = tree["encoder"]["units"][layer][path]
  lead = holder["wi"].shape[:-2]
  holder["bi"], holder["bo"] = (rng.normal(size=lead + (n,)) if path == "ffn" else np.zeros(lead + (n,))
                                for n in (F, M))
  return tree


def test_each_expert_copies_the_dense_ffn_s_biases_too():
  """With biases (NLLB-200's model.bias), the experts' bi [E, H] and bo [E, M] are the dense FFN's: without them
  the upcycled model would not compute its dense parent."""
  dense = with_biases(dense_tree(), "layer_0", "ffn")
  up = init_from.initial_params(dense, with_biases(moe_tree(), "layer_1", "moe"), name="dense")
  ffn, moe = dense["encoder"]["units"]["layer_0"]["ffn"], up["encoder"]["units"]["layer_1"]["moe"]
  for u in range(2):
    for e in range(4):
      np.testing.assert_array_equal(moe["bi"][u, e], ffn["bi"][2 * u + 1])
      np.testing.assert_array_equal(moe["bo"][u, e], ffn["bo"][2 * u + 1])
  unbiased = init_from.initial_params(dense_tree(), with_biases(moe_tree(), "layer_1", "moe"), name="dense")
  np.testing.assert_array_equal(unbiased["encoder"]["units"]["layer_1"]["moe"]["bi"], 0)  # none to copy: zeros
  with pytest.raises(WorkdirError, match=r"the dense FFN of dense's encoder layer 1 has ffn/bi, ffn/bo, this "
                                         r"model's experts none: set moe.expert_bias=True"):
    init_from.initial_params(dense, moe_tree(), name="dense")


@pytest.mark.parametrize("upcycle", [True, False])
def test_a_moe_config_from_a_dense_run_upcycles_it_unless_told_not_to(tmp_path, upcycle):
  """configs/nllb.py's init_from_upcycle=False: a dense NLLB-200 is fine-tuned as it is, not turned into the
  default MoE; upcycling gives the experts the dense FFN's biases (moe.expert_bias)."""
  config_files.save(small_config(**{"model.moe_interval": 0, "model.bias": True}), tmp_path, started=False)
  config = small_config(init_from=str(tmp_path), init_from_upcycle=upcycle)
  assert config.model.moe_interval and not config.moe.expert_bias
  keys = init_from.source_keys(config)
  if upcycle:
    assert "model.moe_interval" not in keys and keys["moe.expert_bias"] is True and keys["model.bias"] is True
  else:
    assert keys["model.moe_interval"] == 0 and "moe.expert_bias" not in keys and keys["model.bias"] is True

"""Task-level routing (moe.router='language'): each token's source tag, and tools/extract: the model cut to some
languages' experts translates those languages as the full model does."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt import config_files
from gshard_mt.batch import SOURCE_KEYS
from gshard_mt.data import pipeline
from gshard_mt.errors import WorkdirError
from gshard_mt.evaluation import evaluate
from gshard_mt.model import decode
from gshard_mt.model.layers import source_tags
from gshard_mt.tools import extract
from gshard_mt.training import checkpoint as checkpoint_lib
from gshard_mt.training.setup import build
from tests.helpers import small_config


def test_source_tags_of_packed_pairs_and_of_beams():
  src = jnp.array([[7, 1, 1, 8, 1, 0], [9, 1, 1, 1, 1, 1]])
  src_segments = jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
  segments = jnp.array([[1, 1, 2, 2, 2, 0, 0], [1, 1, 1, 0, 0, 0, 0]])
  np.testing.assert_array_equal(source_tags(src, src_segments, segments),
                                [[7, 7, 8, 8, 8, 0, 0], [9, 9, 9, 0, 0, 0, 0]])
  beams = jnp.ones((6, 1), jnp.int32)  # 2 sentences x 3 beams, row n of sentence n // 3
  np.testing.assert_array_equal(source_tags(src, src_segments, beams, beams=True)[:, 0], [7, 7, 7, 9, 9, 9])


def test_kept_experts_top_up_to_the_most_any_layer_chose():
  count, kept = extract.kept_experts([np.array([[0, 1, 0, 1], [0, 0, 1, 0]], bool), np.array([1, 0, 0, 0], bool)])
  assert count == 2
  np.testing.assert_array_equal(kept[0], [[1, 3], [0, 2]])
  np.testing.assert_array_equal(kept[1], [0, 1])


def test_chosen_experts_follow_the_routers_rule_bias_included():
  from gshard_mt.config.moe import MoeConfig

  vectors = np.eye(3, 4)  # three languages
  wg = np.stack([np.eye(4) * 3, np.eye(4)[::-1] * 3])  # two scanned units [U, M, E]
  top1 = MoeConfig(router="language", num_selected=1)
  np.testing.assert_array_equal(extract.chosen_experts({"wg": wg}, vectors, top1),
                                [[1, 1, 1, 0], [0, 1, 1, 1]])
  biased = {"wg": wg, "router_bias": np.array([[0, 0, 0, 5.0], [0, 0, 0, 0]])}  # unit 0: expert 3 for all
  np.testing.assert_array_equal(extract.chosen_experts(biased, vectors, top1), [[0, 0, 0, 1], [0, 1, 1, 1]])


def random_run(workdir, tokenizer_dir, tweak=lambda params: params, **overrides):
  """A work directory holding a checkpoint, at step 1, of random parameters for small_config(**overrides) (changed
  by `tweak`): what eval.py and the extraction need, without compiling the model's initialisation."""
  shutil.copytree(tokenizer_dir, workdir / "tokenizer")
  config = small_config(**overrides)
  setup = build(config, pipeline.load(config, workdir).tokenizer.vocab_size)
  rng = np.random.default_rng(0)
  params = tweak(jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.5, s.shape), s.dtype),
                              setup.abstract_state.params))
  state = setup.abstract_state.replace(step=jnp.ones((), jnp.int32), params=params,
                                       opt_state=jax.jit(setup.tx.init)(params), rng=jnp.zeros((2,), jnp.uint32))
  with checkpoint_lib.Checkpoints(workdir / "checkpoints", async_save=False) as ckpts:
    ckpts.save(1, state, {"seed": 0, "next_index": 0}, force=True)
  config_files.save(config, workdir)
  return workdir


def test_every_per_expert_parameter_is_cut_to_the_kept_experts():
  """wg [M, E], the experts' wi, wo and their biases bi [E, H], bo [E, M] (NLLB-MoE's), scanned units first."""
  rng = np.random.default_rng(0)
  U, E, M, H = 2, 4, 3, 5
  moe = {"wg": rng.normal(size=(U, M, E)), "wi": rng.normal(size=(U, E, M, H)), "wo": rng.normal(size=(U, E, H, M)),
         "bi": rng.normal(size=(U, E, H)), "bo": rng.normal(size=(U, E, M))}
  params = {"encoder": {"units": {"layer_1": {"moe": moe, "norm": {"scale": np.ones((U, M))}}}}}
  keep = np.array([[1, 3], [0, 2]])
  cut, kept = extract.extract_params(params, [keep])
  out = cut["encoder"]["units"]["layer_1"]["moe"]
  for u in range(U):
    np.testing.assert_array_equal(out["wg"][u], moe["wg"][u][:, keep[u]])
    for name in ("wi", "wo", "bi", "bo"):
      np.testing.assert_array_equal(out[name][u], moe[name][u][keep[u]], err_msg=name)
  assert kept == {"encoder/units/layer_1/moe": keep.tolist()}


def test_extracted_model_translates_its_languages_as_the_full_model(tmp_path, tokenizer_dir):
  run = random_run(tmp_path / "run", tokenizer_dir, **{"moe.router": "language", "moe.dispatch": "grouped",
                                                       "moe.num_selected": 1})
  extract.main(["--workdir", str(run), "--languages", "fra,deu"])
  full, small = evaluate.restore(run), evaluate.restore(tmp_path / "run-fra-deu")
  assert small.model_cfg.moe.num_experts < full.model_cfg.moe.num_experts
  tokens = full.data.tokens["test"]
  pairs = np.concatenate([np.flatnonzero(tokens.lang == tokens.languages.index(lang))[:3] for lang in ("fra", "deu")])
  batch = decode_batch(tokens, pairs)
  outputs = [decode.Translator(r.model_cfg, r.params, beam_size=1, max_len=12)(batch) for r in (full, small)]
  np.testing.assert_array_equal(outputs[0], outputs[1])
  assert len({tuple(row) for row in outputs[0]}) > 1  # not one output for every sentence


def test_runs_it_cannot_extract_exactly_are_refused_before_anything_is_read(tmp_path):
  """Only language routing gives each language fixed experts, and with bias balancing the top-k of softmax + bias
  over fewer experts may differ."""
  for overrides, reason in (({"moe.router": "gshard"}, "routed by token"),
                            ({"moe.router": "expert_choice", "moe.decoder_router": "gshard"}, "token-level routers"),
                            ({"moe.balance": "bias", "moe.aux_loss_weight": 0.0}, "trained with moe.balance='bias'")):
    run = tmp_path / reason[:5]
    config_files.save(small_config(**{"moe.router": "language", "moe.dispatch": "grouped", **overrides}), run)
    with pytest.raises(WorkdirError, match=reason):
      extract.main(["--workdir", str(run), "--languages", "fra"])
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(reason[:5])) == [reason[:5]]  # no output
  # An output holding an earlier extraction's checkpoints: one line, not Orbax's StepAlreadyExistsError at the end.
  run, output = tmp_path / "lang", tmp_path / "lang-fra"
  config_files.save(small_config(**{"moe.router": "language", "moe.dispatch": "grouped"}), run)
  (output / checkpoint_lib.FOLDER / "600").mkdir(parents=True)
  with pytest.raises(WorkdirError, match=f"{output}: holds checkpoints already"):
    extract.main(["--workdir", str(run), "--languages", "fra"])


def decode_batch(tokens, pairs) -> dict:
  """Padded source rows of `pairs` (one pair a row), as evaluation builds them."""
  L = int(tokens.src_len[pairs].max())
  batch = {key: np.zeros((len(pairs), L), np.int32) for key in SOURCE_KEYS}
  for row, i in enumerate(pairs):
    n = int(tokens.src_len[i])
    batch["inputs"][row, :n] = tokens.src_tokens[tokens.src_offsets[i]:tokens.src_offsets[i] + n]
    batch["inputs_segmentation"][row, :n] = 1
    batch["inputs_position"][row, :n] = np.arange(n)
  return {k: jnp.asarray(v) for k, v in batch.items()}

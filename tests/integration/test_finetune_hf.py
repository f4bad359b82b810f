"""Fine-tuning from an imported NLLB-MoE model (tests/fixtures/hf/nllb_moe) on another corpus: init_from takes the
source's architecture (the model and moe keys left at their defaults) and its NLLB tokenizer; step 0 is the imported
model; the run trains and evaluates; keys that change the parameters are refused in one line naming them."""

import json
import pathlib

import jax
import numpy as np
import pytest

from gshard_mt import cli
from gshard_mt.errors import ConfigError
from gshard_mt.evaluation import evaluate
from gshard_mt.hf import convert
from gshard_mt.tools import import_hf
from gshard_mt.training import init_from, loop, validate

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "nllb_moe"
DATA = {"data.source": "tsv", "data.max_length": "24", "batch_size": "8",
        "num_train_steps": "4", "log_every": "1", "eval_every": "4", "eval_batches": "1", "checkpoint_every": "4",
        "data.prefetch": "1", "moe.group_size": "64"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("finetune")
  import_hf.main(["--from", str(FIXTURE), "--workdir", str(root / "nllb")])
  words = ["chat", "chien", "maison", "Hund", "Katze", "Haus", "petit", "grand", "klein", "rot"]
  lines = [f"{lang}\t{words[i % 10]} {words[(i * 3) % 10]} {i}\tthe {i} {words[(i * 7) % 10]}"
           for i in range(200) for lang in ("fra", "deu")]
  (root / "pairs.tsv").write_text("\n".join(lines) + "\n")
  config = cli.load("configs/nllb.py", DATA | {"init_from": str(root / "nllb"),
                                               "data.path": str(root / "pairs.tsv")})
  result = loop.train_and_evaluate(config, root / "ft")
  return root, result


def test_finetuning_takes_the_source_model_and_tokenizer_and_trains(runs):
  root, result = runs
  assert np.isfinite(result["loss"])
  saved, source = (validate.load_saved(root / name) for name in ("ft", "nllb"))
  assert saved.model == source.model and saved.moe.num_experts == 4 and saved.moe.expert_dropout == 0.2
  assert saved.data.tokenizer == source.data.tokenizer and saved.data.source == "tsv"
  abstract = convert.run_setup(root / "ft")[2].abstract_target()
  start, imported = (evaluate.restore_state(root / name, abstract, 0)[1] for name in ("ft", "nllb"))
  for a, b in zip(jax.tree.leaves(start.params), jax.tree.leaves(imported.params)):  # step 0: the imported model
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  metrics = [json.loads(line) for line in (root / "ft" / "metrics.jsonl").read_text().splitlines()]
  assert any(np.isfinite(m.get("dev_loss", np.nan)) for m in metrics)  # evaluated on the new corpus's dev split


def test_keys_that_change_the_parameters_are_refused(runs):
  root, _ = runs
  config = cli.load("configs/nllb.py", DATA | {"init_from": str(root / "nllb"), "model.emb_dim": "32",
                                               "moe.num_experts": "8", "data.path": str(root / "pairs.tsv")})
  with pytest.raises(ConfigError, match=r"model.emb_dim=32 here, 16 there, moe.num_experts=8 here, 4 there") as e:
    init_from.resolved(config)
  assert "\n" not in str(e.value)


def test_a_dense_nllb_200_is_fine_tuned_as_it_is(tmp_path):
  """configs/nllb.py from an imported M2M100 (dense): its architecture, not the default MoE upcycled from it."""
  import_hf.main(["--from", str(FIXTURE.parent / "m2m100"), "--workdir", str(tmp_path / "nllb")])
  config = init_from.resolved(cli.load("configs/nllb.py", DATA | {"init_from": str(tmp_path / "nllb"),
                                                                  "data.path": str(tmp_path / "pairs.tsv")}))
  source = validate.load_saved(tmp_path / "nllb")
  assert config.model == source.model and config.model.moe_interval == 0

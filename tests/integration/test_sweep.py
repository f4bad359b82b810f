"""A sweep's results table from a trained point."""

import shutil

import pytest

from gshard_mt.tools import sweep
from gshard_mt.training import loop
from tests.helpers import small_config

pytestmark = pytest.mark.slow  # trains


def test_results_table(tmp_path, tokenizer_dir):
  workdir = tmp_path / "e4"
  shutil.copytree(tokenizer_dir, workdir / "tokenizer")
  loop.train_and_evaluate(small_config(eval_every=6), workdir)
  row = sweep.summarize(workdir, {"name": "e4", "moe.num_experts": 4})
  assert row["step"] == 6 and row["dev_loss"] > 0 and row["tokens_per_s"] > 0 and row["parameters"] > 0
  assert row["bleu"] is None
  table = sweep.write_tables([row], tmp_path)
  assert "| e4 | 4 |" in table and (tmp_path / "results.csv").read_text().startswith("name,moe.num_experts")

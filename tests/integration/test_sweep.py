"""A sweep's results table from a trained point."""

import json
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
  for name, bleu in (("test-3", 6.0), ("test-6", 10.0), ("dev-6", 12.0), ("test-6-avg2", 11.0), ("test-60", 13.0)):
    (workdir / "eval" / name).mkdir(parents=True)
    (workdir / "eval" / name / "scores.json").write_text(json.dumps({"average": {"bleu": bleu}}))
  assert sweep.summarize(workdir, {"name": "e4"})["bleu"] == 10.0  # the standard test evaluation of the final step
  table = sweep.write_tables([row], tmp_path)
  assert "| e4 | 4 |" in table and (tmp_path / "results.csv").read_text().startswith("name,moe.num_experts")

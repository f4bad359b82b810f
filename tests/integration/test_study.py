"""The study's whole code path at toy size: two multilingual points and a bilingual baseline, trained two at a time,
decoded at their best checkpoints and reported with pictures."""

import json
import shutil

import pytest

from gshard_mt.tools import study
from tests.helpers import LANGUAGES, ROOT, small_args

pytestmark = pytest.mark.slow  # trains three models and decodes them


def test_study_end_to_end(tmp_path, tokenizer_dir):
  sweep = tmp_path / "toy.py"
  sweep.write_text(f"""BASE = {str(ROOT / "configs" / "tiny.py")!r}


def get_sweep():
  return [{{"name": "dense", "data.languages": {LANGUAGES!r}, "model.moe_interval": 0, "model.mlp_dim": 96}},
          {{"name": "e2", "data.languages": {LANGUAGES!r}, "moe.num_experts": 2}},
          {{"name": "bi_fra", "data.languages": "fra", "data.vocab_size": 400, "model.moe_interval": 0}}]
""")
  root = tmp_path / "study"
  for name in ("dense", "e2"):  # same data config as the session's tokenizer
    shutil.copytree(tokenizer_dir, root / name / "tokenizer")
  point_keys = ("--config.data.languages=", "--config.moe.num_experts=")  # set per point: extra args come last
  extra = [a for a in small_args(eval_every=3, num_train_steps=6) if not a.startswith(point_keys)]
  study.main(["--sweep", str(sweep), "--root", str(root), "--jobs", "2", "--", *extra])
  report = json.loads((root / "report.json").read_text())
  names = [p["name"] for p in report["points"]]
  assert names == ["dense", "e2", "bi_fra"]
  dense, e2, bi = report["points"]
  assert not dense["bilingual"] and bi["bilingual"] and (dense["experts"], e2["experts"]) == (0, 2)
  assert set(dense["test"]) == set(LANGUAGES.split(",")) and list(bi["test"]) == ["fra"]
  assert set(e2["routing"]) == {"encoder_0", "decoder_0"} and dense["routing"] == {}
  (row,) = report["comparison"]
  assert row["stream"] == "fra" and row["delta_e2"] == pytest.approx(e2["test"]["fra"]["bleu"] - row["bilingual"])
  assert (root / "delta_bleu.png").stat().st_size > 0 and (root / "experts.png").stat().st_size > 0
  assert "| fra |" in (root / "report.md").read_text()
  for name in names:  # with --jobs, each point's training and decoding write to its own log
    log = (root / name / "sweep.log").read_text()
    assert f"== {name}: " in log and "done: step 6" in log and f"wrote {root / name}/eval/test-" in log

"""translate.py's note on a model that does not translate yet, from the run's own scores."""

import json

from gshard_mt.tools import translate
from tests.helpers import started_as


def test_the_note_reads_the_newest_test_bleu_else_the_logged_dev_bleu(tmp_path, monkeypatch):
  started_as(monkeypatch, ["python", "translate.py", "--workdir", str(tmp_path)])
  assert translate.quality_note(tmp_path) is None  # nothing to tell from
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 400, "dev_bleu_greedy": 1.11}) + "\n"
                                          + json.dumps({"step": 600, "dev_bleu_greedy": 1.07}) + "\n")
  assert translate.quality_note(tmp_path).startswith(
      f"{tmp_path}'s greedy dev BLEU at step 600 is 1.07: this model does not translate yet")
  for step, bleu in ((200, 30.0), (600, 0.8), (1400, None)):
    folder = tmp_path / "eval" / (f"test-{step}" if bleu else f"test-{step}-beam1")  # not a standard evaluation
    folder.mkdir(parents=True)
    (folder / "scores.json").write_text(json.dumps({"average": {"bleu": bleu}}))
  note = translate.quality_note(tmp_path)
  assert note.startswith(f"{tmp_path}'s test BLEU at step 600 (eval.py) is 0.80: this model does not translate yet")
  assert "python train.py --config configs/multi30k.py --workdir runs/multi30k" in note
  (tmp_path / "eval" / "test-600" / "scores.json").write_text(json.dumps({"average": {"bleu": 29.5}}))
  assert translate.quality_note(tmp_path) is None

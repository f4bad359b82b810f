"""translate.py's messages: the note on a model that does not translate yet, from the run's own scores, and an
unknown language's near matches and the command that lists the known ones."""

import json
import shutil

import pytest

from gshard_mt import config as config_lib
from gshard_mt.errors import ConfigError, WorkdirError
from gshard_mt.tools import translate
from tests.helpers import ROOT, small_config, started_as
from tests.unit.test_hints import train_argv

TATOEBA = sorted({path.name.split(".")[1].removesuffix("-eng") for path in (ROOT / "data" / "tatoeba").glob("*.gz")})


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


@pytest.mark.parametrize("make", [False, True])
def test_an_unknown_language_of_many_gives_the_close_ones_and_the_command_that_lists_them(make, monkeypatch):
  if make and not shutil.which("make"):
    pytest.skip("no make")
  started_as(monkeypatch, ["python", "translate.py", "--workdir", "runs/x", "--src_lang", "fre"], make=make)
  with pytest.raises(WorkdirError) as raised:
    translate.check_language("fre", TATOEBA, "--src_lang", "runs/x")
  message = str(raised.value)
  assert message.startswith("--src_lang: unknown source language 'fre'; did you mean ") and len(message) < 300
  assert message.split("?")[0].endswith("did you mean bre, fra, fry") and len(TATOEBA) == 112
  lister = message.split("this model knows 112 languages (")[1].removesuffix(" lists them)")
  assert train_argv(lister, make, "translate.py") == ["--workdir", "runs/x", "--list_languages"]
  with pytest.raises(WorkdirError, match=r"^--src_lang: unknown source language 'zzz'; this model knows fra, fry$"):
    translate.check_language("zzz", ["fra", "fry"], "--src_lang", "runs/x")  # a few: all of them


def test_the_languages_of_a_run_whose_config_json_names_unknown_code_are_refused_before_its_data(tmp_path):
  values = config_lib.to_dict(small_config())
  values["moe"]["router"] = "gshrad"
  (tmp_path / "config.json").write_text(json.dumps(values))
  with pytest.raises(ConfigError, match=r"config.json: moe.router='gshrad'.*\(in the run's saved config\)$"):
    translate.languages_of(tmp_path)

"""The study's report from hand-made points: baselines matched to streams, ΔBLEU, routing averages, best step."""

import json

import pytest

from gshard_mt.errors import WorkdirError
from gshard_mt.tools import study


def point(name, experts, bilingual=False, languages="", source="tatoeba+multi30k", test=None):
  return {"name": name, "bilingual": bilingual, "source": source, "languages": languages, "experts": experts,
          "moe_interval": 2 if experts else 0, "best_step": 10, "dev_loss": 2.0, "tokens_per_s": 100.0,
          "routing": {}, "test": test or {}, "average_bleu": None, "average_chrf": None,
          "signature": "nrefs:1|case:mixed"}


def scores(**bleu):
  return {s: {"bleu": b, "chrf": 2 * b, "train_pairs": n, "sentences": 7} for s, (b, n) in bleu.items()}


def test_baseline_stream_takes_the_source_when_joined_sources_share_the_language():
  streams = ["deu.multi30k", "deu.tatoeba", "fry"]
  assert study.baseline_stream({"languages": "deu", "source": "multi30k"}, streams) == "deu.multi30k"
  assert study.baseline_stream({"languages": "deu", "source": "tatoeba"}, streams) == "deu.tatoeba"
  assert study.baseline_stream({"languages": "fry", "source": "tatoeba"}, streams) == "fry"
  assert study.baseline_stream({"languages": "ces", "source": "multi30k"}, streams) is None


def test_compare_gives_delta_bleu_sorted_by_training_pairs(tmp_path):
  multi_scores = {"deu.multi30k": (30.0, 29000), "fry": (8.0, 139), "bos": (12.0, 284)}
  points = [point(name, experts, test={k: {"bleu": b + extra, "chrf": 2 * (b + extra), "train_pairs": n, "sentences": 7}
                                      for k, (b, n) in multi_scores.items()})
            for name, experts, extra in (("dense", 0, 0.0), ("e4", 4, 1.0))]
  points.append(point("bi_fry", 0, True, "fry", "tatoeba", scores(fry=(2.0, 139))))
  points.append(point("bi_deu", 0, True, "deu", "multi30k", scores(deu=(33.0, 29000))))
  table = study.compare(points)
  assert [r["stream"] for r in table] == ["deu.multi30k", "fry"]  # bos has no baseline
  assert table[0]["delta_dense"] == pytest.approx(-3.0) and table[0]["delta_e4"] == pytest.approx(-2.0)
  assert table[1]["delta_dense"] == pytest.approx(6.0) and table[1]["bilingual"] == 2.0
  text = study.markdown(points, table)
  assert "| fry | 139 | 7 | 2.0 | 8.0 (+6.0) | 9.0 (+7.0) |" in text
  assert "| mean Δ | | | | +1.50 | +2.50 |" in text
  assert table[1]["delta_chrf_e4"] == pytest.approx(14.0) and "fry dense +12.0, e4 +14.0" in text
  pictures = study.plot(points, table, tmp_path)
  assert [p.name for p in pictures] == ["delta_bleu.png", "experts.png"] and all(p.stat().st_size for p in pictures)
  # A multilingual model on fewer languages (no fry): the streams all of them share, not a KeyError.
  points.append(point("e8_no_fry", 8, test={k: v for k, v in points[1]["test"].items() if k != "fry"}))
  assert [r["stream"] for r in study.compare(points)] == ["deu.multi30k"]


def test_routing_averages_the_last_quarter_of_each_layer():
  rows = [{"step": s, "moe/encoder_0/load_cv": float(s), "moe/encoder_0/load_min": 0.0,
           "moe/encoder_0/load_max": 1.0, "moe/encoder_0/top1_dropped": 0.0, "moe/encoder_0/top2_dropped": s / 10}
          for s in range(1, 9)] + [{"step": 9, "dev_loss": 3.0}]
  out = study.routing(rows)
  assert list(out) == ["encoder_0"]
  assert out["encoder_0"]["load_cv"] == pytest.approx(7.5) and out["encoder_0"]["top2_dropped"] == pytest.approx(0.75)


def test_best_step_is_the_checkpoint_with_the_lowest_dev_loss(tmp_path):
  for step in (2, 4):
    (tmp_path / "checkpoints" / str(step)).mkdir(parents=True)
  rows = [{"step": 2, "dev_loss": 3.0}, {"step": 3, "dev_loss": 1.0}, {"step": 4, "dev_loss": 2.5}]
  (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
  assert study.best_step(tmp_path) == 4  # step 3 has no checkpoint
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 3, "dev_loss": 1.0}))
  with pytest.raises(WorkdirError, match="no checkpoint with a dev loss"):
    study.best_step(tmp_path)


def test_moe_layers_names_which_ffns_are_moe():
  assert study.moe_layers({"experts": 0, "moe_interval": 0}) == "-"
  assert study.moe_layers({"experts": 8, "moe_interval": 1}) == "all"
  assert study.moe_layers({"experts": 8, "moe_interval": 2}) == "1 in 2"
  table = study.markdown([point("e8_all", 8) | {"moe_interval": 1}], [])
  assert "| e8_all | 8 | all | 10 | 2.000 |" in table


def test_a_point_is_trained_when_it_has_the_last_step_this_command_would_train(tmp_path):
  """Rerun with `-- --config.num_train_steps=12`, a point that finished 6 steps is not done: it trains on (it was
  reported from its old run, unsaid)."""
  point, run = {"name": "p", "num_train_steps": 6}, tmp_path / "p"
  assert not study.trained(run, "configs/tiny.py", point, [])
  (run / "checkpoints" / "6").mkdir(parents=True)
  assert study.trained(run, "configs/tiny.py", point, [])
  assert not study.trained(run, "configs/tiny.py", point, ["--config.num_train_steps=12"])
  (run / "checkpoints" / "12").mkdir()
  assert study.trained(run, "configs/tiny.py", point, ["--config.num_train_steps", "12", "--other"])


@pytest.mark.parametrize("steps, kept", [(200, None), (300, 12)])
def test_a_point_keeps_every_checkpoint_whatever_its_length(tmp_path, monkeypatch, steps, kept):
  """Early stopping may pick any checkpoint: a point trained longer (-- --config.num_train_steps=300, with one every
  25 steps and 8 kept by the study's sweep) keeps all 12 rather than decoding the best of the last 8."""
  from etils import epath

  from gshard_mt.tools import sweep
  from tests.helpers import ROOT

  commands = []

  def run(command, *_):
    commands.append(command)
    raise InterruptedError  # stop before decoding: only the training command matters here

  monkeypatch.setattr(sweep, "run", run)
  point = {"name": "dense", "num_train_steps": 200, "eval_every": 25, "checkpoint_every": 25, "keep_checkpoints": 8}
  with pytest.raises(InterruptedError):
    study.run_point(str(ROOT / "configs" / "study.py"), epath.Path(tmp_path), point,
                    [f"--config.num_train_steps={steps}"])
  assert sum(arg.startswith("--config.keep_checkpoints=") for arg in commands[0]) == 1 + (kept is not None)
  assert (commands[0][-1] == f"--config.keep_checkpoints={kept}") == (kept is not None)

"""train.py's own lines: what it prints when the run ends, and when a finished run is run again."""

import importlib.util

import pytest

from tests.helpers import ROOT


@pytest.fixture
def train_main(monkeypatch, tmp_path):
  """train.py's main with the loop and the plots replaced: (main, the result the loop returns)."""
  from gshard_mt.tools import plot
  from gshard_mt.training import loop

  spec = importlib.util.spec_from_file_location("train_script", ROOT / "train.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  result = {}
  monkeypatch.setattr(loop, "train_and_evaluate", lambda config, workdir: result)
  monkeypatch.setattr(plot, "plot_run", lambda workdir: [tmp_path / "run" / "training.png"])
  return module.main, result


ARGS = ["--config", str(ROOT / "configs" / "tiny.py"), "--config.num_train_steps=50"]


def test_a_finished_run_run_again_says_how_to_train_longer(train_main, tmp_path, capsys):
  main, result = train_main
  result.update(step=50, preempted=False)  # no step ran: the newest checkpoint is the last step
  main(ARGS + ["--workdir", str(tmp_path / "run")])
  out = capsys.readouterr().out.splitlines()
  assert out[0] == "done: step 50"
  assert out[1] == (f"{tmp_path / 'run'} is trained to num_train_steps=50 already; to train it longer, run the same "
                    "command with --config.num_train_steps=N (N > 50)")


def test_a_run_that_trained_says_nothing_more(train_main, tmp_path, capsys):
  main, result = train_main
  result.update(step=50, loss=2.5, dev_loss=3.25, preempted=False)
  main(ARGS + ["--workdir", str(tmp_path / "run")])
  assert capsys.readouterr().out.splitlines()[:2] == ["done: step 50, dev loss 3.250",
                                                      f"wrote {tmp_path / 'run' / 'training.png'}"]

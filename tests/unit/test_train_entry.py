"""train.py's own lines: what it prints when the run ends, and when a finished run is run again."""

import importlib.util

import pytest

from tests.helpers import ROOT, started_as


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


@pytest.mark.parametrize("make", [False, True])
def test_a_finished_run_run_again_says_how_to_train_longer(make, train_main, tmp_path, capsys, monkeypatch):
  """The command it prints is the one the run was started with (by python or by make), with more steps."""
  main, result = train_main
  result.update(step=50, preempted=False)  # no step ran: the newest checkpoint is the last step
  argv = ARGS + ["--workdir", str(tmp_path / "run")]
  started_as(monkeypatch, ["python", "train.py", *argv], make=make)
  main(argv)
  out = capsys.readouterr().out.splitlines()
  assert out[0] == "done: step 50"
  run, config = tmp_path / "run", ROOT / "configs" / "tiny.py"
  again = (f'make train CONFIG={config} WORKDIR={run} ARGS="--config.num_train_steps=100"' if make else
           f"python train.py --config {config} --config.num_train_steps=100 --workdir {run}")
  assert out[1] == (f"{tmp_path / 'run'} is trained to num_train_steps=50 already; to train it longer (here to "
                    f"twice as many steps; any number above 50 will do): {again}")


def test_a_run_that_trained_says_nothing_more(train_main, tmp_path, capsys):
  main, result = train_main
  result.update(step=50, loss=2.5, dev_loss=3.25, preempted=False)
  main(ARGS + ["--workdir", str(tmp_path / "run")])
  assert capsys.readouterr().out.splitlines()[:2] == ["done: step 50, dev loss 3.250",
                                                      f"wrote {tmp_path / 'run' / 'training.png'}"]


def test_a_model_that_does_not_translate_yet_says_so(train_main, tmp_path, capsys, monkeypatch):
  main, result = train_main
  result.update(step=50, loss=2.5, dev_loss=3.25, dev_bleu_greedy=1.07, preempted=False)
  started_as(monkeypatch, ["python", "train.py", *ARGS, "--workdir", str(tmp_path / "run")])
  main(ARGS + ["--workdir", str(tmp_path / "run")])
  assert capsys.readouterr().out.splitlines()[1].startswith(
      "its greedy dev BLEU 1.07: this model does not translate yet (the default run, configs/tiny.py, is a smoke test")
  result.update(dev_bleu_greedy=30.1)
  main(ARGS + ["--workdir", str(tmp_path / "run")])
  assert "does not translate" not in capsys.readouterr().out

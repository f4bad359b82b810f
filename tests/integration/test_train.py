"""End-to-end training on the shipped corpus: exact resumption, preemption, corrupt checkpoints, non-finite guard."""

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from gshard_mt import io
from gshard_mt.data import pipeline
from gshard_mt.errors import WorkdirError
from gshard_mt.evaluation import evaluate
from gshard_mt.model import decode
from gshard_mt.training import checkpoint as checkpoint_lib
from gshard_mt.training import dev_eval, loop, validate
from gshard_mt.training import metrics as metrics_lib
from gshard_mt.training.schedules import schedule_of
from gshard_mt.training.setup import build
from tests.helpers import ROOT, small_args, small_config

pytestmark = pytest.mark.slow  # trains, compiles for many devices or starts processes


def losses(workdir):
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


def restore_params(workdir, step):
  with ocp.StandardCheckpointer() as ckpt:
    return ckpt.restore(workdir / "checkpoints" / str(step) / "state")["params"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tokenizer_dir):
  workdir = tmp_path_factory.mktemp("uninterrupted")
  shutil.copytree(tokenizer_dir, workdir / "tokenizer")
  result = loop.train_and_evaluate(small_config(eval_every=6, eval_bleu_every=4, eval_bleu_per_language=2), workdir)
  return workdir, result


def test_runs_and_writes_everything(uninterrupted):
  workdir, result = uninterrupted
  assert result["step"] == 6 and np.isfinite(result["dev_loss"])
  assert sorted(os.listdir(workdir / "checkpoints")) == ["3", "6"]
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  train_rows = [r for r in rows if "loss" in r]
  assert [r["step"] for r in train_rows] == [1, 2, 3, 4, 5, 6]
  for key in ("nll", "accuracy", "aux_loss", "z_loss", "learning_rate", "grad_norm", "packing_efficiency",
              "moe/encoder_0/top1_dropped", "moe/decoder_0/load_cv"):
    assert key in rows[0], key
  # the first step's time is its compile's: timed from the second on
  assert "tokens_per_s" not in rows[0] and all(key in train_rows[1] for key in ("tokens_per_s", "step_time", "mfu"))
  assert any("dev_perplexity" in r for r in rows)
  assert (workdir / "config.json").exists() and list((workdir / "tensorboard").iterdir())
  loads = [json.loads(line) for line in open(workdir / "expert_load.jsonl")]
  assert [r["step"] for r in loads] == [1, 2, 3, 4, 5, 6]
  for layer in ("moe/encoder_0/load", "moe/decoder_0/load"):
    assert len(loads[-1][layer]) == 4 and sum(loads[-1][layer]) == pytest.approx(1.0, abs=1e-5)
    assert min(loads[-1][layer]) == pytest.approx(train_rows[5][f"{layer}_min"], abs=1e-6)  # the logged summary


def test_dev_bleu_at_its_interval_and_the_last_step(uninterrupted):
  workdir, result = uninterrupted
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  bleu = [r for r in rows if "dev_bleu_greedy" in r]
  assert [r["step"] for r in bleu] == [4, 6]
  assert all(0 <= r["dev_bleu_greedy"] <= 100 and 0 <= r["dev_chrf_greedy"] <= 100 and r["dev_seconds"] > 0
             and (r["dev_bleu_per_language"], r["dev_bleu_languages"], r["dev_bleu_sentences"]) == (2, 5, 10)
             for r in bleu)
  assert "dev_loss" in bleu[-1] and "dev_loss" not in bleu[0]  # one row when both evaluations fall on a step
  assert result["dev_bleu_greedy"] == bleu[-1]["dev_bleu_greedy"]


def test_dev_bleu_is_that_of_the_saved_parameters(uninterrupted):
  """The last step's scores again, from the checkpoint restored as eval.py restores it, outside the training mesh."""
  workdir, result = uninterrupted
  run = evaluate.restore(workdir, split="dev")
  sample = dev_eval.language_sample(run.data.tokens["dev"], list(run.data.text["dev"]), 2, 1024, run.config.seed)
  translator = decode.Translator(run.model_cfg, run.params, beam_size=1, max_len=run.config.data.max_length)
  scores = dev_eval.evaluate_bleu(translator, run.data, sample, run.config.batch_size, run.config.data.max_length)
  assert scores["dev_bleu_greedy"] == pytest.approx(result["dev_bleu_greedy"])
  assert scores["dev_chrf_greedy"] == pytest.approx(result["dev_chrf_greedy"])


def test_dev_bleu_is_what_eval_py_reports_with_greedy_search(uninterrupted, tmp_path):
  """Training's statistic on every dev pair of two languages is eval.py's average with --beam_size 1 on them: the
  same hypotheses, one scoring function."""
  workdir = tmp_path / "run"
  shutil.copytree(uninterrupted[0], workdir)
  run = evaluate.restore(workdir, split="dev")
  languages = ["ell", "kab"]
  sample = dev_eval.language_sample(run.data.tokens["dev"], languages, 10**6, 10**9, run.config.seed)
  translator = decode.Translator(run.model_cfg, run.params, beam_size=1, max_len=run.config.data.max_length)
  training = dev_eval.evaluate_bleu(translator, run.data, sample, run.config.batch_size, run.config.data.max_length)
  scores = evaluate.evaluate(workdir, split="dev", beam_size=1, languages=languages)
  assert training["dev_bleu_sentences"] == scores["decoding"]["sentences"]
  assert training["dev_bleu_greedy"] == pytest.approx(scores["average"]["bleu"], abs=1e-9)
  assert training["dev_chrf_greedy"] == pytest.approx(scores["average"]["chrf"], abs=1e-9)
  assert scores["average"]["chrf"] > 0  # hypotheses to compare, even after 6 steps


def test_resume_is_exact(uninterrupted, workdir):
  reference, _ = uninterrupted
  loop.train_and_evaluate(small_config(num_train_steps=3, eval_every=6), workdir)
  assert sorted(losses(workdir)) == [1, 2, 3]
  loop.train_and_evaluate(small_config(eval_every=6), workdir)  # resumes at step 3
  assert losses(workdir) == losses(reference)  # bit for bit
  for a, b in zip(jax.tree.leaves(restore_params(workdir, 6)), jax.tree.leaves(restore_params(reference, 6))):
    np.testing.assert_array_equal(a, b)


def test_config_json_is_written_only_when_steps_run_from_a_restored_state(uninterrupted, tmp_path):
  """A resume whose checkpoint does not restore (another optimizer's state) ends with config.json as it was; so
  does rerunning a finished run with other settings (no step runs). Before, the first left config.json describing
  a run no checkpoint matches, which the original command then counted as finished and eval.py could not read."""
  reference, _ = uninterrupted
  workdir = tmp_path / "copy"
  shutil.copytree(reference, workdir)
  before = (workdir / "config.json").read_text()
  other = "adam" if validate.load_saved(workdir).optimizer.name == "adafactor" else "adafactor"
  with pytest.raises(WorkdirError, match="no checkpoint in .* restores"):
    loop.train_and_evaluate(small_config(eval_every=6, num_train_steps=12, **{"optimizer.name": other}), workdir)
  assert (workdir / "config.json").read_text() == before
  loop.train_and_evaluate(small_config(eval_every=6, **{"optimizer.learning_rate": 0.5}), workdir)  # finished
  assert (workdir / "config.json").read_text() == before


def test_an_unreadable_checkpoint_is_set_aside_and_the_run_finishes(uninterrupted, tmp_path, caplog):
  reference, _ = uninterrupted
  workdir = tmp_path / "copy"
  shutil.copytree(reference, workdir)
  for path in (workdir / "checkpoints" / "6" / "state").rglob("*"):
    if path.is_file():
      path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 3])
  with caplog.at_level(logging.WARNING):
    result = loop.train_and_evaluate(small_config(eval_every=6), workdir)  # resumes at 3, saves 6 again
  assert "checkpoints/6 cannot be restored" in caplog.text and result["step"] == 6
  assert sorted(os.listdir(workdir / "checkpoints")) == ["3", "6", "6.unreadable"]
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]  # each step once
  assert losses(workdir) == losses(reference)


@pytest.fixture
def nan_aux_loss(monkeypatch):
  """Every step's aux loss NaN, as a diverged router's (the config refuses a NaN weight)."""
  monkeypatch.setattr(metrics_lib, "total_moe_losses", lambda *_: (jnp.float32(np.nan), jnp.float32(0.0)))


def test_nonfinite_stop_names_the_step_and_writes_no_checkpoint(workdir, nan_aux_loss):
  with pytest.raises(loop.NonFiniteError, match=r"at step 1 .*last good checkpoint: .*\(none\)"):
    loop.train_and_evaluate(small_config(), workdir)
  assert not (workdir / "checkpoints").exists() or not os.listdir(workdir / "checkpoints")


def test_nonfinite_skip_keeps_the_parameters(workdir, nan_aux_loss):
  config = small_config(**{"nonfinite": "skip", "num_train_steps": 3})
  result = loop.train_and_evaluate(config, workdir)
  assert result["skipped_updates"] == 1  # per logged step, each skipped
  rates = [row["learning_rate"] for row in io.read_jsonl(workdir / "metrics.jsonl") if "learning_rate" in row]
  first = float(schedule_of(config.optimizer, config.num_train_steps)(jnp.asarray(0)))
  assert len(rates) == 3 and rates == pytest.approx([first] * 3)  # the schedule waits for an update
  setup = build(config, pipeline.load(config, workdir).tokenizer.vocab_size)
  initial = setup.init_state(config.seed).params
  for a, b in zip(jax.tree.leaves(restore_params(workdir, 3)), jax.tree.leaves(initial)):
    np.testing.assert_array_equal(a, b)


def test_target_rows_of_their_own_length(workdir, monkeypatch):
  """Training rows of 24 source / 16 target tokens (data.max_target_length): the encoder and decoder MoE layers
  group 192 and 128 tokens, the step counts each side's real tokens, and the dev loss (one pair per row, both
  sides data.max_length) runs on the same parameters. A step's evaluation comes before its checkpoint: a run
  killed between them resumes before that step and evaluates it again (the other way, never)."""
  order = []
  evaluate, save = dev_eval.DevEvaluator.__call__, checkpoint_lib.Checkpoints.save
  monkeypatch.setattr(dev_eval.DevEvaluator, "__call__", lambda *a: order.append("eval") or evaluate(*a))
  monkeypatch.setattr(checkpoint_lib.Checkpoints, "save", lambda *a, **k: order.append("save") or save(*a, **k))
  config = small_config(num_train_steps=2, checkpoint_every=2, eval_every=2, **{"data.max_target_length": 16})
  result = loop.train_and_evaluate(config, workdir)
  assert order == ["eval", "save"]
  steps = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  steps = [r for r in steps if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2] and all(np.isfinite(r["loss"]) for r in steps)
  for r in steps:
    assert 0.5 * 8 * 16 < r["target_tokens"] <= 8 * 16 and 0.5 * 8 * 24 < r["source_tokens"] <= 8 * 24
  assert np.isfinite(result["dev_loss"])


def train_command(workdir, *before, **overrides):
  return [sys.executable, *before, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny.py"),
          "--workdir", str(workdir), *small_args(**overrides)]


@pytest.mark.parametrize("signum, name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")])
def test_a_signal_saves_a_checkpoint_that_resumes(workdir, signum, name):
  proc = subprocess.Popen(train_command(workdir, num_train_steps=10_000, checkpoint_every=10_000),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  metrics = workdir / "metrics.jsonl"
  deadline = time.time() + 240
  while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
    assert proc.poll() is None, proc.stdout.read()
    time.sleep(0.5)
  with pytest.raises(WorkdirError, match=f"is in use by another writer: host .*, pid {proc.pid},"):
    loop.train_and_evaluate(small_config(), workdir)  # a second writer
  proc.send_signal(signum)
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 0, out
  assert f"{name}: saving a checkpoint" in out and "Traceback" not in out
  steps = [int(s) for s in os.listdir(workdir / "checkpoints")]
  assert len(steps) == 1 and steps[0] >= 3
  if signum == signal.SIGINT:
    return
  result = loop.train_and_evaluate(small_config(num_train_steps=steps[0] + 1, log_every=1), workdir)
  assert result["step"] == steps[0] + 1 and np.isfinite(result["loss"])


def test_a_full_disk_ends_in_one_line_and_loses_nothing(workdir):
  """ENOSPC on the metrics write after step 4 (injected: the write of a process with a full disk): exit 74 at
  once with one line naming the file; the checkpoint of step 3 is intact and no temporary is left."""
  inject = ("import errno, runpy, sys; from gshard_mt import io; append = io.append\n"
            "def full(path, data):\n"
            "  if isinstance(data, str) and 'step\": 5' in data:\n"
            "    raise OSError(errno.ENOSPC, 'No space left on device', str(path))\n"
            "  append(path, data)\n"
            "io.append = full; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
  proc = subprocess.run(train_command(workdir, "-c", inject), capture_output=True, text=True, timeout=240)
  assert proc.returncode == 74, proc.stderr
  assert proc.stderr.splitlines()[-1].startswith(f"train.py: error: {workdir / 'metrics.jsonl'}: disk full (")
  assert "Traceback" not in proc.stderr
  assert [r["step"] for r in map(json.loads, open(workdir / "metrics.jsonl")) if "loss" in r] == [1, 2, 3, 4]
  assert sorted(os.listdir(workdir / "checkpoints")) == ["3"]
  assert not [p for p in workdir.rglob("*") if ".tmp" in p.name or "orbax-checkpoint-tmp" in p.name]
  _, state, _ = checkpoint_lib.Checkpoints(workdir / "checkpoints").restore(
      build(small_config(), pipeline.load(small_config(), workdir).tokenizer.vocab_size).abstract_target())
  assert int(state.step) == 3

"""The training progress bar's rate and ETA count training steps only: neither the first step (compiling) nor an
evaluation moves them (issue 40: after a 22 s compile the bar showed an ETA of 3 h 42 min, and the ETA jumped after
every evaluation). A fake clock drives the bar as the loop does, through StepLogger."""

import numpy as np
import pytest

from gshard_mt import cli
from gshard_mt.training import loop


class Clock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


class Writer:
  def __init__(self):
    self.rows = []

  def write(self, step, values):
    self.rows.append((step, values))

  def write_vectors(self, step, values):
    pass


@pytest.fixture
def clock(monkeypatch):
  clock = Clock()
  monkeypatch.setattr("tqdm.std.time", clock)  # tqdm's clock (each bar keeps the function it started with)
  return clock


def steps(bar, clock, n, seconds=1.0):
  for _ in range(n):
    clock.now += seconds
    bar.update(1)


def test_the_rate_leaves_out_the_compiling_first_step_and_evaluations(clock):
  bar = loop.progress_bar(total=100, start=10, enabled=True)  # a run resumed at step 10
  logger = loop.StepLogger(None, Writer(), bar, (0.0, 0.0), None)
  logger.first_step_starts(11)
  clock.now += 30  # compiling
  logger.add({"loss": np.float32(1.0)}, first=True)
  bar.update(1)
  assert bar.format_dict["rate"] is None and bar.format_dict["n"] - bar.format_dict["initial"] == 0  # no ETA yet
  steps(bar, clock, 10)
  assert bar.format_dict["elapsed"] == pytest.approx(10)
  clock.now += 60  # an evaluation
  logger.log_dev(21, {"dev_loss": 2.0, "dev_perplexity": 7.4}, seconds=60)
  steps(bar, clock, 10)
  state = bar.format_dict
  rate = (state["n"] - state["initial"]) / state["elapsed"]  # as tqdm computes it with smoothing=0
  assert state["n"] == 31 and rate == pytest.approx(1.0)  # one step a second: the ETA is the 69 steps left, 69 s
  bar.close()


def test_without_the_first_step_left_out_the_rate_would_count_the_compile(clock):
  """The check above can fail: the same run with a bar that counts everything gives a third of the rate."""
  bar = loop.progress_bar(total=100, start=10, enabled=True)
  clock.now += 30
  bar.update(1)
  steps(bar, clock, 10)
  state = bar.format_dict
  assert (state["n"] - state["initial"]) / state["elapsed"] == pytest.approx(11 / 40)
  bar.close()


def test_the_first_steps_time_is_its_compile_and_no_rate_is_logged_for_it(monkeypatch):
  """A log step right after the compiling first step (log_every=1) logged its ~0 s as the step time (tokens/s in
  the millions); the steps timed after it give the rate."""
  now = [0.0]
  monkeypatch.setattr(loop.time, "perf_counter", lambda: now[0])
  writer, bar = Writer(), loop.progress_bar(total=10, start=0, enabled=False)
  config = cli.load("configs/tiny.py")  # 8 rows of 128 + 80 slots
  logger = loop.StepLogger(config, writer, bar, (0.0, 0.0), None)
  step = {"loss": np.float32(2.0), "finite": True, "source_tokens": np.float32(60), "target_tokens": np.float32(40),
          "learning_rate": np.float32(1e-3)}
  logger.first_step_starts(1)
  now[0] += 30  # compiling
  logger.add(step, first=True)
  logger.flush(1)
  for _ in range(2):
    now[0] += 0.5
    logger.add(step)
  logger.flush(3)
  with logger.left_out():  # a checkpoint's save, right after the log step, is no step's time
    now[0] += 10
  for _ in range(2):
    now[0] += 0.5
    logger.add(step)
  logger.flush(5)
  (_, first), (_, later), (_, after_save) = writer.rows
  assert "tokens_per_s" not in first and "step_time" not in first and first["loss"] == 2.0
  assert later["step_time"] == pytest.approx(0.5) and later["tokens_per_s"] == pytest.approx(200.0)
  assert after_save["step_time"] == pytest.approx(0.5)
  # of the steps trained, whatever the prefetching read ahead: 100 real tokens a step in 8 x 208 slots
  assert first["packing_efficiency"] == later["packing_efficiency"] == pytest.approx(100 / (8 * 208))

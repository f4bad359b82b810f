"""The training program: one readable loop around a jitted train step.

  python train.py --config configs/tiny.py --workdir runs/tiny [--config.key=value ...]

Re-running the same command resumes from the newest checkpoint; SIGTERM saves a checkpoint and exits. Updates whose
loss or gradient is not finite are skipped on the device; with `nonfinite='stop'` the run stops at the next log or
checkpoint step, naming the step, and writes no checkpoint after it. Dev evaluations (`dev_eval`) are timed on their
own (`dev_seconds`) and left out of the training step times.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import multihost_utils
from tqdm import tqdm

from gshard_mt import compilation_cache, config_files, io, lock
from gshard_mt import config as config_lib
from gshard_mt.data import pipeline
from gshard_mt.data import prepare as prepare_lib
from gshard_mt.model.transformer import Transformer
from gshard_mt.parallel import distributed
from gshard_mt.parallel import mesh as mesh_lib
from gshard_mt.training import checkpoint as checkpoint_lib
from gshard_mt.training import dev_eval, init_from
from gshard_mt.training import metrics as metrics_lib
from gshard_mt.training.setup import Setup, build

log = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
  """The loss or the gradient was not finite."""


class StepLogger:
  """Keeps each step's metrics on the device until a log step, then fetches, checks and writes their mean."""

  def __init__(self, config, writer: metrics_lib.Writer, bar, flops_per_token: tuple[float, float], checkpoint_dir):
    self.config, self.writer, self.bar, self.flops_per_token = config, writer, bar, flops_per_token
    self.checkpoint_dir = checkpoint_dir
    self.pending, self.last, self.last_saved = [], {}, None
    self.started = self.timer = time.perf_counter()
    self.timed_steps = 0

  def first_step_starts(self, step: int):
    tqdm.write(f"step {step}: compiling the training step, then running it")
    self.first_step, self.first_started = step, time.perf_counter()

  def add(self, step_metrics, first: bool = False):
    self.pending.append(step_metrics)
    self.timed_steps += 1
    if first:  # one sync after compilation, which the step times and the progress bar's rate then leave out
      jax.block_until_ready(step_metrics["loss"])
      self.timer, self.timed_steps = time.perf_counter(), 0
      cache = compilation_cache.summary()
      tqdm.write(f"step {self.first_step}: compiled and ran in {self.timer - self.first_started:.1f} s"
                 + (f" ({cache})" if cache else ""))
      self.bar.unpause()  # the bar's rate starts from now, without the compile
      self.bar.initial = self.bar.n + 1  # nor the first step: the rate is (n - initial) / elapsed

  def leave_out(self, seconds: float):
    """Leaves `seconds` (an evaluation, a checkpoint's save) out of the step times and the bar's rate."""
    self.timer += seconds
    if not self.bar.disable:  # tqdm's unpause would also take out the steps since the bar last printed
      self.bar.start_t += seconds

  @contextlib.contextmanager
  def left_out(self):
    """Leaves the time of the block out of the step times and the bar's rate."""
    started = time.perf_counter()
    yield
    self.leave_out(time.perf_counter() - started)

  def log_dev(self, step: int, dev: dict, seconds: float):
    """Writes one evaluation's metrics, its `seconds` left out of the step times and the bar's rate."""
    self.leave_out(seconds)
    dev = dev | {"dev_seconds": seconds, "wall_s": time.perf_counter() - self.started}
    self.writer.write(step, dev)
    self.last.update(dev)
    parts = [f"dev loss {dev['dev_loss']:.3f}, perplexity {dev['dev_perplexity']:.1f}"] if "dev_loss" in dev else []
    if "dev_bleu_greedy" in dev:
      parts.append(f"dev BLEU {dev['dev_bleu_greedy']:.2f}, chrF++ {dev['dev_chrf_greedy']:.1f} (greedy; each "
                   f"language's corpus BLEU over {dev['dev_bleu_per_language']:.0f} sampled sentences, mean over "
                   f"{dev['dev_bleu_languages']:.0f} languages)")
    tqdm.write(f"step {step}: " + "; ".join(parts) + f" [{seconds:.1f} s]")

  def flush(self, step: int):
    if not self.pending:
      return
    values = jax.device_get(self.pending)  # the only host sync of the loop
    bad = [step - len(values) + i + 1 for i, v in enumerate(values) if not v["finite"]]
    if bad and self.config.nonfinite == "stop":
      last_good = self.last_saved if self.last_saved is not None else "(none)"
      raise NonFiniteError(f"non-finite loss or gradient at step {bad[0]} (update skipped); last good "
                           f"checkpoint: {self.checkpoint_dir}/{last_good}")
    now = time.perf_counter()
    sides = np.mean([(v["source_tokens"], v["target_tokens"]) for v in values], axis=0)  # [2]
    vectors = {k for k in values[-1] if np.ndim(values[-1][k]) == 1}  # per-expert loads
    last = {k: float(np.mean([v[k] for v in values])) for k in values[-1] if k != "finite" and k not in vectors}
    # real tokens / slots of the steps logged: of the batches trained, not of those the prefetching read ahead
    slots = self.config.batch_size * sum(config_lib.row_lengths(self.config))
    last.update(learning_rate=float(values[-1]["learning_rate"]), skipped_updates=len(bad),
                wall_s=now - self.started, packing_efficiency=float(sides.sum()) / slots)
    if self.timed_steps:  # none when only the compiling first step is pending: its time is its compile's
      seconds = (now - self.timer) / self.timed_steps
      last.update(step_time=seconds, tokens_per_s=float(sides.sum()) / seconds,
                  mfu=metrics_lib.mfu(float(np.dot(self.flops_per_token, sides)) / seconds, jax.devices()[0],
                                      jax.device_count()))
    self.writer.write(step, last)
    self.writer.write_vectors(step, {k: np.mean([v[k] for v in values], axis=0) for k in sorted(vectors)})
    postfix = {"loss": f"{last['loss']:.3f}"}
    if "tokens_per_s" in last:
      postfix["tok_s"] = f"{last['tokens_per_s']:.0f}"
    self.bar.set_postfix(postfix)
    self.last = last
    self.pending, self.timer, self.timed_steps = [], now, 0


def progress_bar(total: int, start: int, enabled: bool) -> tqdm:
  """The training progress bar, whose rate (and ETA) is the mean over training steps only (smoothing=0): StepLogger
  leaves out the compiling first step and the evaluations."""
  return tqdm(total=total, initial=start, disable=not enabled, desc="train", unit="step", smoothing=0)


@contextlib.contextmanager
def stop_requests():
  """Yields a list that names the signal once the run should save a checkpoint and stop: SIGTERM (a preemption)
  or the first Ctrl-C; a second Ctrl-C exits at once. With several processes JAX's preemption service names a step
  that all stop at, so they save the same checkpoint; a Ctrl-C becomes a SIGTERM to take the same path."""
  flag, interrupts = [], []
  several = jax.process_count() > 1

  def on_sigint(*_):
    if interrupts:
      print("\ninterrupted again: exiting without waiting for the checkpoint", file=sys.stderr, flush=True)
      os._exit(130)
    interrupts.append(True)
    log.warning("Ctrl-C: saving a checkpoint and exiting (Ctrl-C again exits at once)")
    if several:
      os.kill(os.getpid(), signal.SIGTERM)
    else:
      flag.append("Ctrl-C")

  previous = {signal.SIGINT: signal.signal(signal.SIGINT, on_sigint)}
  if not several:
    previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, lambda *_: flag.append("SIGTERM"))
  try:
    yield flag
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


def close_all(*closers):
  """Calls every closer, even after one fails; then raises the first failure."""
  errors = []
  for close in closers:
    try:
      close()
    except Exception as e:  # noqa: BLE001 - the rest must still close
      errors.append(e)
  if errors:
    raise errors[0]


def prepare(config, workdir) -> pipeline.Data:
  """Checks the config, then loads the data: process 0 prepares the corpus when it is missing while the others
  wait, then every process memory-maps the same shards."""
  mesh_lib.check(config, jax.device_count())
  distributed.check_batch_split(config)
  if jax.process_index() == 0:
    config_files.check_same_run(config, workdir, started=any((io.path(workdir) / checkpoint_lib.FOLDER).glob("*")))
  prepared = distributed.checked_on_process_0(lambda: prepare_lib.for_run(config.data, workdir, record=True).name)
  return pipeline.load(config, workdir, distributed.broadcast_object(prepared))


def restore_or_init(config, workdir, setup: Setup, ckpts: checkpoint_lib.Checkpoints, batches):
  """The newest readable checkpoint (the batches moved to where it stopped, unreadable newer ones set aside), or a
  fresh state; then config.json, if steps are to run: a resume that fails leaves the file as it was, and a finished
  run keeps the settings it was trained with (a sweep point rerun with another learning rate trains nothing)."""
  restored = ckpts.restore(setup.abstract_target(), set_aside=True)
  if restored:
    step, state, data_state = restored
    batches.set_state(data_state)
    log.info("resumed from %s at step %d", ckpts.directory, step)
  elif config.init_from:  # upcycled or fine-tuned: the starting point saved as step 0
    step, state = 0, init_from.initial_state(config, workdir, setup)
    ckpts.save(0, state, batches.state(0), force=True)
  else:
    step, state = 0, setup.init_state(config.seed)
  if jax.process_index() == 0 and step < config.num_train_steps:
    config_files.save(config, workdir)
  return state


def train_and_evaluate(config, workdir: io.PathLike) -> dict:
  """Trains (resuming from the work directory's checkpoints) under its lock; returns the last logged metrics."""
  workdir = io.path(workdir)
  with lock.hold(workdir, enabled=jax.process_index() == 0):
    config = init_from.resolved(config)  # before the data: a fine-tuned run's architecture and tokenizer
    data = prepare(config, workdir)
    return _train(config, workdir, data, build(config, data.tokenizer))


def _train(config, workdir, data: pipeline.Data, setup: Setup) -> dict:
  """The loop: restores or initialises the state, then trains, logs, evaluates and saves until the last step."""
  ckpts = checkpoint_lib.Checkpoints(workdir / checkpoint_lib.FOLDER, config.checkpoint_every, config.keep_checkpoints)
  batches = data.train_batches(config, jax.process_index(), jax.process_count())
  state = restore_or_init(config, workdir, setup, ckpts, batches)
  step = start = int(jax.device_get(state.step))
  is_main = jax.process_index() == 0
  writer = metrics_lib.Writer(workdir, enabled=is_main)
  writer.keep_until(start)  # the rows a killed run logged past its last checkpoint are logged again
  step_fn = setup.jit_train_step(Transformer(setup.model_cfg, deterministic=False), config)
  bar = progress_bar(config.num_train_steps, start, is_main)
  flops_per_token = tuple(metrics_lib.step_flops(state.params, config.moe, *side)
                          for side in ((1, 0), (0, 1)))  # per source token, per target token
  logger = StepLogger(config, writer, bar, flops_per_token, ckpts.directory)
  logger.last_saved = ckpts.latest()
  evaluate = dev_eval.DevEvaluator(config, setup, data, state.params)
  feed = pipeline.prefetch(batches, config.data.prefetch,
                           lambda item: (item[0], distributed.global_batch(item[1], setup.mesh, setup.rules)))

  def save(step, next_index):
    logger.flush(step)  # checks for non-finite steps before anything is written
    with logger.left_out():  # the save's blocking part (its copy, waiting for the last save) is no step's
      ckpts.save(step, state, batches.state(next_index), force=True)
    logger.last_saved = step

  closers = (feed.close, bar.close, ckpts.wait, ckpts.close)
  try:
    with stop_requests() as preempted, jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
      while step < config.num_train_steps and not preempted:
        if step == start:
          logger.first_step_starts(step + 1)
        index, batch = next(feed)
        state, step_metrics = step_fn(state, batch)
        logger.add(step_metrics, first=step == start)  # the first step's sync keeps compilation out of timings
        step += 1
        bar.update(1)
        if jax.process_count() > 1 and multihost_utils.reached_preemption_sync_point(step):
          preempted.append("SIGTERM")
        last = step == config.num_train_steps
        if step % config.log_every == 0 or last:
          logger.flush(step)
        if evaluate.due(step, last):  # before the step's checkpoint, so that a step saved has its evaluation
          jax.block_until_ready(state.params)  # the steps queued before it keep their time (off a log step)
          started = time.perf_counter()
          logger.log_dev(step, evaluate(step, state.params, last), time.perf_counter() - started)
        if ckpts.should_save(step) or last:
          save(step, index + 1)
      if preempted:
        log.warning("%s: saving a checkpoint at step %d and exiting", preempted[0], step)
        if logger.last_saved != step:
          save(step, step)
  except BaseException:
    with contextlib.suppress(Exception):  # the failure that stopped the run is the one to report
      close_all(*closers)
    ckpts.remove_partial()
    raise
  close_all(*closers)
  return {"step": step, **logger.last, "preempted": bool(preempted)}

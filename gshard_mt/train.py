"""The training program: one readable loop around a jitted train step.

  python train.py --config configs/tiny.py --workdir runs/tiny [--config.key=value ...]

Re-running the same command resumes from the newest checkpoint. SIGTERM saves a checkpoint and exits.
Updates whose loss or gradient is not finite are skipped on the device; with `nonfinite='stop'` the run then stops
at the next log or checkpoint step, naming the step, and no checkpoint after it is written.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import pathlib
import signal
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.experimental import multihost_utils
from tqdm import tqdm

from gshard_mt import checkpoint as checkpoint_lib
from gshard_mt import config as config_lib
from gshard_mt import metrics as metrics_lib
from gshard_mt import partitioning
from gshard_mt.data import pipeline
from gshard_mt.model import Transformer, TransformerConfig, dummy_batch

log = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
  """The loss or the gradient was not finite."""


@struct.dataclass
class TrainState:
  step: jax.Array
  params: dict
  opt_state: optax.OptState
  rng: jax.Array  # raw key data; step keys are fold_in(rng, step), so a resumed run draws the same noise


def learning_rate_schedule(opt_config):
  """Linear warmup to `learning_rate`, then (rsqrt) peak * sqrt(warmup / step)."""
  peak, warmup = opt_config.learning_rate, max(opt_config.warmup_steps, 1)

  def schedule(step):
    step = jnp.maximum(step.astype(jnp.float32), 1.0)
    lr = peak * jnp.minimum(1.0, step / warmup)
    if opt_config.schedule == "rsqrt":
      lr = lr * jnp.sqrt(warmup / jnp.maximum(step, warmup))
    return lr

  return schedule


def make_optimizer(opt_config) -> optax.GradientTransformation:
  schedule = learning_rate_schedule(opt_config)
  if opt_config.name == "adafactor":  # GShard's: factored second moments, no first moment
    opt = optax.adafactor(schedule, weight_decay_rate=opt_config.weight_decay or None)
  else:
    opt = optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=opt_config.weight_decay)
  return optax.chain(optax.clip_by_global_norm(opt_config.grad_clip_norm), opt)


def cross_entropy(logits, targets, weights, label_smoothing: float):
  """(smoothed loss sum, nll sum, correct count) over the weighted positions; logits [B, L, V] float32."""
  V = logits.shape[-1]
  log_probs = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  if label_smoothing > 0:
    confidence, low = 1.0 - label_smoothing, label_smoothing / (V - 1)
    # Subtracting the entropy of the smoothed target makes a perfect prediction score 0.
    floor = -(confidence * np.log(confidence) + (V - 1) * low * np.log(low + 1e-20))
    loss = confidence * nll - low * (jnp.sum(log_probs, -1) + nll) - floor
  else:
    loss = nll
  correct = jnp.argmax(logits, -1) == targets
  return jnp.sum(loss * weights), jnp.sum(nll * weights), jnp.sum(correct * weights)


def train_step(state: TrainState, batch: dict, *, model: Transformer, tx, config):
  """One update; returns (state, metrics). A non-finite loss or gradient leaves the state unchanged."""
  rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
  dropout_rng, gating_rng = jax.random.split(rng)
  weights = (batch["targets_segmentation"] > 0).astype(jnp.float32)
  num_tokens = jnp.maximum(weights.sum(), 1.0)

  def loss_fn(params):
    logits, stats = model.apply({"params": params}, batch, rngs={"dropout": dropout_rng, "gating": gating_rng})
    loss, nll, correct = cross_entropy(logits, batch["targets"], weights, config.optimizer.label_smoothing)
    aux, z = metrics_lib.total_moe_losses(stats)
    total = loss / num_tokens + config.moe.aux_loss_weight * aux + config.moe.z_loss_weight * z
    return total, (nll, correct, aux, z, stats)

  (loss, (nll, correct, aux, z, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  new = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state)
  # Skipping keeps the old parameters and optimizer state but still advances the step (and the data).
  new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state.replace(step=state.step + 1))
  metrics = {"loss": loss, "nll": nll / num_tokens, "accuracy": correct / num_tokens, "aux_loss": aux,
             "z_loss": z, "grad_norm": grad_norm, "learning_rate": learning_rate_schedule(config.optimizer)(
                 state.step), "finite": finite, "target_tokens": weights.sum(),
             "source_tokens": (batch["inputs_segmentation"] > 0).sum().astype(jnp.float32),
             **metrics_lib.moe_summary(stats)}
  return new, metrics


def eval_step(params, batch, *, model: Transformer):
  """(nll sum, correct count, token count) of one padded batch, deterministic (evaluation capacity)."""
  logits, _ = model.apply({"params": params}, batch)
  weights = (batch["targets_segmentation"] > 0).astype(jnp.float32)
  _, nll, correct = cross_entropy(logits, batch["targets"], weights, 0.0)
  return nll, correct, weights.sum()


@dataclasses.dataclass
class Setup:
  """What training and evaluation build from a config: model, optimizer, mesh, shardings, abstract state."""

  model_cfg: TransformerConfig
  mesh: jax.sharding.Mesh
  rules: list
  tx: optax.GradientTransformation
  abstract_state: TrainState
  state_shardings: TrainState

  def init_state(self, seed: int) -> TrainState:
    init = functools.partial(_init_state, self.model_cfg, self.tx, seed)
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      return jax.jit(init, out_shardings=self.state_shardings)()

  def jit_train_step(self, model: Transformer, config):
    """The jitted train step with the state's and the batch's shardings fixed (the state is donated)."""
    return jax.jit(functools.partial(train_step, model=model, tx=self.tx, config=config),
                   in_shardings=(self.state_shardings, partitioning.batch_sharding(self.mesh)),
                   out_shardings=(self.state_shardings, None), donate_argnums=0)

  def abstract_target(self):
    return checkpoint_lib.abstract_with_shardings(self.abstract_state, self.state_shardings)


def _init_state(model_cfg, tx, seed, boxed=False):
  key = jax.random.key(seed)
  variables = Transformer(model_cfg).init({"params": key}, dummy_batch(1, 8))
  params = variables["params"] if boxed else nn.unbox(variables["params"])
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=None if boxed else tx.init(params),
                    rng=jax.random.key_data(jax.random.fold_in(key, 1)))


def build(config, vocab_size: int, devices=None) -> Setup:
  """Model, optimizer, mesh and the shardings of the train state, all without allocating anything."""
  model_cfg = TransformerConfig.from_config(config, vocab_size)
  mesh = partitioning.make_mesh(config, devices)
  rules = partitioning.rules(config)
  tx = make_optimizer(config.optimizer)
  boxed = jax.eval_shape(functools.partial(_init_state, model_cfg, tx, 0, True)).params
  abstract = jax.eval_shape(functools.partial(_init_state, model_cfg, tx, 0))
  param_sh = partitioning.param_shardings(boxed, mesh, rules)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  shardings = TrainState(step=replicated, params=param_sh, rng=replicated,
                         opt_state=partitioning.like_params_shardings(abstract.opt_state, abstract.params,
                                                                      param_sh, mesh))
  return Setup(model_cfg, mesh, rules, tx, abstract, shardings)


def evaluate_loss(setup: Setup, params, data: pipeline.Data, config, split="dev") -> dict:
  """Token-level nll, perplexity and accuracy on (up to `config.eval_batches` batches of) a split."""
  model = Transformer(setup.model_cfg, deterministic=True)
  step = jax.jit(functools.partial(eval_step, model=model))
  totals = np.zeros(3)
  tokens = data.tokens[split]
  ids = np.random.default_rng(0).permutation(len(tokens))  # a fixed mix of all languages, even when capped
  batches = pipeline.eval_batches(tokens, config.batch_size, config.data.max_length, ids)
  with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
    for i, batch in enumerate(batches):
      if config.eval_batches and i >= config.eval_batches:
        break
      batch.pop("index")
      local = partitioning.process_rows(batch)
      totals += np.array(jax.device_get(step(params, partitioning.global_batch(local, setup.mesh))))
  nll = totals[0] / max(totals[2], 1)
  return {f"{split}_loss": nll, f"{split}_perplexity": float(np.exp(min(nll, 50))),
          f"{split}_accuracy": totals[1] / max(totals[2], 1)}


class StepLogger:
  """Keeps each step's metrics on the device until a log step, then fetches, checks and writes their mean."""

  def __init__(self, config, writer: metrics_lib.Writer, bar, flops_per_token: float, checkpoint_dir):
    self.config, self.writer, self.bar, self.flops_per_token = config, writer, bar, flops_per_token
    self.checkpoint_dir = checkpoint_dir
    self.pending: list = []
    self.last: dict = {}
    self.last_saved = None
    self.start_timer()

  def start_timer(self):
    """Called after the first step has run, so that compilation is not counted in the step times."""
    self.timer, self.timed_steps = time.perf_counter(), 0

  def add(self, step_metrics):
    self.pending.append(step_metrics)
    self.timed_steps += 1

  def flush(self, step: int, packing_efficiency: float):
    if not self.pending:
      return
    values = jax.device_get(self.pending)  # the only host sync of the loop
    bad = [step - len(values) + i + 1 for i, v in enumerate(values) if not v["finite"]]
    if bad and self.config.nonfinite == "stop":
      last_good = self.last_saved if self.last_saved is not None else "(none)"
      raise NonFiniteError(f"non-finite loss or gradient at step {bad[0]} (update skipped); last good "
                           f"checkpoint: {self.checkpoint_dir}/{last_good}")
    now = time.perf_counter()
    seconds = (now - self.timer) / max(self.timed_steps, 1)
    tokens = float(np.mean([v["source_tokens"] + v["target_tokens"] for v in values]))
    last = {k: float(np.mean([v[k] for v in values])) for k in values[-1] if k != "finite"}
    last.update(learning_rate=float(values[-1]["learning_rate"]), skipped_updates=len(bad), step_time=seconds,
                tokens_per_s=tokens / seconds, packing_efficiency=packing_efficiency,
                mfu=metrics_lib.mfu(self.flops_per_token * tokens / seconds, jax.devices()[0].device_kind,
                                    jax.device_count()))
    self.writer.write(step, last)
    self.bar.set_postfix(loss=f"{last['loss']:.3f}", tok_s=f"{last['tokens_per_s']:.0f}")
    self.last = last
    self.pending, self.timer, self.timed_steps = [], now, 0


def train_and_evaluate(config, workdir: str | pathlib.Path) -> dict:
  """Trains (resuming when the work directory has checkpoints); returns the last logged metrics."""
  workdir = pathlib.Path(workdir)
  config_lib.validate(config, jax.device_count())
  is_main = jax.process_index() == 0
  if is_main:
    config_lib.save(config, workdir)
  if jax.process_count() > 1:  # process 0 trains and caches the tokenizer; the others then read it
    if is_main:
      pipeline.load(config, workdir)
    multihost_utils.sync_global_devices("gshard_mt: data prepared")
  data = pipeline.load(config, workdir)
  setup = build(config, data.tokenizer.vocab_size)
  ckpts = checkpoint_lib.Checkpoints(workdir / "checkpoints", config.checkpoint_every, config.keep_checkpoints)
  batches = data.train_batches(config, jax.process_index(), jax.process_count())
  restored = ckpts.restore(setup.abstract_target())
  if restored:
    step, state, data_state = restored
    batches.set_state(data_state)
    log.info("resumed from %s at step %d", ckpts.directory, step)
  else:
    state = setup.init_state(config.seed)
  start = int(jax.device_get(state.step))
  model = Transformer(setup.model_cfg, deterministic=False)
  step_fn = setup.jit_train_step(model, config)
  bar = tqdm(total=config.num_train_steps, initial=start, disable=not is_main, desc="train", unit="step")
  logger = StepLogger(config, metrics_lib.Writer(workdir, enabled=is_main), bar,
                      6 * metrics_lib.active_params(state.params, config.moe.num_experts), ckpts.directory)
  logger.last_saved = ckpts.latest()
  put = lambda item: (item[0], partitioning.global_batch(item[1], setup.mesh))  # noqa: E731
  feed = pipeline.prefetch(batches, config.data.prefetch, put)
  preempted = []
  # One process: a SIGTERM handler. Several: JAX's preemption service sees a SIGTERM on any process and names a
  # step that every process stops at, so all of them save the same checkpoint together.
  multi = jax.process_count() > 1
  previous_handler = None if multi else signal.signal(signal.SIGTERM, lambda *_: preempted.append(True))

  def save(step, next_index):
    logger.flush(step, batches.packing_efficiency)  # checks for non-finite steps before anything is written
    ckpts.save(step, state, {"seed": batches.seed, "next_index": next_index}, force=True)
    logger.last_saved = step

  step = start
  try:
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
      while step < config.num_train_steps and not preempted:
        index, batch = next(feed)
        state, step_metrics = step_fn(state, batch)
        logger.add(step_metrics)
        if step == start:  # one sync after compilation, which the step times then leave out
          jax.block_until_ready(step_metrics["loss"])
          logger.start_timer()
        step += 1
        bar.update(1)
        if multi and multihost_utils.reached_preemption_sync_point(step):
          preempted.append(True)
        if step % config.log_every == 0 or step == config.num_train_steps:
          logger.flush(step, batches.packing_efficiency)
        if ckpts.should_save(step) or step == config.num_train_steps:
          save(step, index + 1)
        if config.eval_every and (step % config.eval_every == 0 or step == config.num_train_steps):
          dev = evaluate_loss(setup, state.params, data, config)
          logger.writer.write(step, dev)
          logger.last.update(dev)
          tqdm.write(f"step {step}: dev loss {dev['dev_loss']:.3f}, perplexity {dev['dev_perplexity']:.1f}")
      if preempted:
        log.warning("SIGTERM: saving a checkpoint at step %d and exiting", step)
        if logger.last_saved != step:
          save(step, step)
  finally:
    feed.close()
    bar.close()
    ckpts.wait()
    ckpts.close()
    logger.writer.close()
    if previous_handler is not None:
      signal.signal(signal.SIGTERM, previous_handler)
  return {"step": step, **logger.last, "preempted": bool(preempted)}

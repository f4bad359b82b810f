"""The jitted computations of training: the state they carry, the loss, one update, one evaluation batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from gshard_mt.model.transformer import Transformer
from gshard_mt.training import metrics as metrics_lib
from gshard_mt.training.optimizer import learning_rate_schedule


@struct.dataclass
class TrainState:
  """Everything a checkpoint holds besides the data iterator's position."""

  step: jax.Array
  params: dict
  opt_state: optax.OptState
  rng: jax.Array  # raw key data; step keys are fold_in(rng, step), so a resumed run draws the same noise


def cross_entropy(logits, targets, weights, label_smoothing: float):
  """(smoothed loss sum, nll sum, correct count) over the weighted positions; logits [B, L, V] in any float dtype,
  read in float32. Written with per-position reductions only (log-sum-exp, target logit, logit sum), so that no
  float32 [B, L, V] log-probabilities are materialised."""
  V = logits.shape[-1]
  z = logits.astype(jnp.float32)
  lse = jax.nn.logsumexp(z, axis=-1)  # [B, L]
  nll = lse - jnp.take_along_axis(z, targets[..., None], axis=-1)[..., 0]
  if label_smoothing > 0:
    confidence, low = 1.0 - label_smoothing, label_smoothing / (V - 1)
    # Subtracting the entropy of the smoothed target makes a perfect prediction score 0.
    floor = -(confidence * np.log(confidence) + (V - 1) * low * np.log(low + 1e-20))
    sum_log_probs = jnp.sum(z, -1) - V * lse
    loss = confidence * nll - low * (sum_log_probs + nll) - floor
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



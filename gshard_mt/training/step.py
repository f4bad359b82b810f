"""The jitted computations of training: the state they carry, the loss, one update, one evaluation batch."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from gshard_mt.model.layers import DROPOUT_KEYS
from gshard_mt.model.loss import logit_stats
from gshard_mt.model.transformer import Transformer
from gshard_mt.moe import balance
from gshard_mt.training import metrics as metrics_lib
from gshard_mt.training.optimizer import FusedAdafactor, schedule_step
from gshard_mt.training.schedules import schedule_of


@struct.dataclass
class TrainState:
  """Everything a checkpoint holds besides the data iterator's position."""

  step: jax.Array
  params: dict
  opt_state: optax.OptState
  rng: jax.Array  # raw key data; step keys are fold_in(rng, step), so a resumed run draws the same noise


def cross_entropy(logits, targets, weights, label_smoothing: float, stats_fn=logit_stats):
  """(smoothed loss sum, nll sum, correct count) over the weighted positions; logits [B, L, V] in any float dtype,
  read in float32 by `stats_fn`'s per-position reductions (`model.loss.logit_stats`, or the run's kernel)."""
  V = logits.shape[-1]
  lse, target_logit, logit_sum, argmax = stats_fn(logits, targets)  # [B, L] each
  nll = lse - target_logit
  if label_smoothing > 0:
    confidence, low = 1.0 - label_smoothing, label_smoothing / (V - 1)
    # Subtracting the entropy of the smoothed target makes a perfect prediction score 0.
    floor = -(confidence * np.log(confidence) + (V - 1) * low * np.log(low + 1e-20))
    sum_log_probs = logit_sum - V * lse
    loss = confidence * nll - low * (sum_log_probs + nll) - floor
  else:
    loss = nll
  correct = argmax == targets
  return jnp.sum(loss * weights), jnp.sum(nll * weights), jnp.sum(correct * weights)


def microbatches(batch: dict, num_microbatches: int) -> dict:
  """[B, ...] arrays -> [K, B/K, ...]: microbatch k holds rows k, K + k, 2K + k, ..., so that each device's block of
  rows splits evenly into the K microbatches and each microbatch is sharded as the batch is (no data moves)."""
  K = num_microbatches
  return jax.tree.map(lambda x: x.reshape(x.shape[0] // K, K, *x.shape[1:]).swapaxes(0, 1), batch)


def _microbatch_loss(params, batch, rng, *, model: Transformer, config, side_tokens, num_microbatches: int):
  """(this microbatch's share of the step's loss, its sums, aux loss and MoE stats): its summed cross entropy / the
  whole batch's real target tokens (`side_tokens['decoder']`), its z-loss by its share of each side's real tokens,
  its aux loss / K (every microbatch has as many groups). The sums include the assignments each router asked of
  each expert (moe.balance='bias'; empty otherwise)."""
  dropout_rng, gating_rng = jax.random.split(rng)
  weights = (batch["targets_segmentation"] > 0).astype(jnp.float32)
  (logits, stats), requested = model.apply({"params": params}, batch, mutable=[balance.COLLECTION],
                                        rngs={"dropout": DROPOUT_KEYS[model.cfg.model.dropout_rng](dropout_rng),
                                              "gating": gating_rng})
  loss, nll, correct = cross_entropy(logits, batch["targets"], weights, config.optimizer.label_smoothing,
                                     model.cfg.ops.logit_stats or logit_stats)
  aux, z = metrics_lib.total_moe_losses(stats, side_tokens)
  moe_loss = config.moe.aux_loss_weight * aux / num_microbatches + config.moe.z_loss_weight * z
  return loss / side_tokens["decoder"] + moe_loss, {
      "sums": (nll, correct, z, dict(requested.get(balance.COLLECTION, {}))), "aux": aux, "stats": stats}


def apply_update(state: TrainState, grads, tx, loss_finite: jax.Array, biases=None):
  """(the state updated by `tx` with `grads`, the MoE selection biases set to `biases`; the gradient's global norm;
  finite). Unless the loss and the norm are finite, the old parameters and optimizer state are kept, but the step
  (and so the data) still advances."""
  kept = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
  if isinstance(tx, FusedAdafactor):  # its kernels take the norm and keep the weights and moments themselves
    params, opt_state, grad_norm, finite = tx.apply(grads, state.opt_state, state.params, loss_finite)
    if biases:
      biases = kept(biases, balance.biases_of(state.params, biases))
    return state.replace(step=state.step + 1, params=balance.with_updated_biases(params, biases),
                         opt_state=opt_state), grad_norm, finite
  grad_norm = optax.tree.norm(grads)
  finite = loss_finite & jnp.isfinite(grad_norm)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  # The selection biases are set by their rule (moe.balance), not by the optimizer (their gradient is zero).
  params = balance.with_updated_biases(optax.apply_updates(state.params, updates), biases)
  new = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  return kept(new, state.replace(step=state.step + 1)), grad_norm, finite


def train_step(state: TrainState, batch: dict, *, model: Transformer, tx, config):
  """One update; returns (state, metrics). A non-finite loss or gradient leaves the state unchanged.

  With config.num_microbatches = K > 1 the gradients of K microbatches are summed in a scan (in float32) before the
  one update; the MoE layers group tokens within each microbatch, and the selection biases move once, by all
  microbatches' assignments. The loss and gradient are then the whole batch's: the cross entropy is divided by the
  whole batch's token count, the z-loss (a mean over real tokens) is weighted by each microbatch's share of them,
  and the aux loss (a mean over equally many groups per microbatch) averages over the microbatches; the routing
  metrics are the whole batch's (`metrics.merge_microbatches`).
  """
  rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
  weights = (batch["targets_segmentation"] > 0).astype(jnp.float32)
  target_tokens, source_tokens = weights.sum(), (batch["inputs_segmentation"] > 0).sum().astype(jnp.float32)
  num_tokens = jnp.maximum(target_tokens, 1.0)
  side_tokens = {"encoder": jnp.maximum(source_tokens, 1.0), "decoder": num_tokens}
  K = config.num_microbatches
  grad_fn = jax.value_and_grad(functools.partial(_microbatch_loss, model=model, config=config,
                                                 side_tokens=side_tokens, num_microbatches=K), has_aux=True)
  if K == 1:
    (loss, out), grads = grad_fn(state.params, batch, rng)
  else:
    def accumulate(total, xs):
      k, micro = xs
      (loss, out), grads = grad_fn(state.params, micro, jax.random.fold_in(rng, k))
      return jax.tree.map(jnp.add, total, (loss, grads)), out

    zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, state.params))
    (loss, grads), outs = jax.lax.scan(accumulate, zero, (jnp.arange(K), microbatches(batch, K)))
    out = {"sums": jax.tree.map(lambda x: x.sum(0), outs["sums"]), "aux": outs["aux"].mean(0),
           "stats": metrics_lib.merge_microbatches(outs["stats"])}
  (nll, correct, z, requested), aux, stats = out["sums"], out["aux"], out["stats"]
  biases = balance.moved_biases(state.params, requested, config.moe.bias_update_rate) if requested else None
  new, grad_norm, finite = apply_update(state, grads, tx, jnp.isfinite(loss), biases)
  learning_rate = schedule_of(config.optimizer, config.num_train_steps)(schedule_step(state.opt_state, state.step))
  metrics = {"loss": loss, "nll": nll / num_tokens, "accuracy": correct / num_tokens, "aux_loss": aux,
             "z_loss": z, "grad_norm": grad_norm, "learning_rate": learning_rate, "finite": finite,
             "target_tokens": target_tokens, "source_tokens": source_tokens, **metrics_lib.moe_summary(stats)}
  return new, metrics


def eval_step(params, batch, *, model: Transformer):
  """(nll sum, correct count, token count) of one padded batch, deterministic (evaluation capacity)."""
  logits, _ = model.apply({"params": params}, batch)
  weights = (batch["targets_segmentation"] > 0).astype(jnp.float32)
  _, nll, correct = cross_entropy(logits, batch["targets"], weights, 0.0)
  return nll, correct, weights.sum()



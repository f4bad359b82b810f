"""The optimizer and its learning-rate schedule, from `config.optimizer`."""

from __future__ import annotations

import jax.numpy as jnp
import optax


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

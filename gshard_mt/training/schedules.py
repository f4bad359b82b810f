"""Learning-rate schedules: each one class, registered by name in `SCHEDULES` (optimizer.schedule), built from the
optimizer section and the run's total steps and called with the step (an int32 array) for the rate.

Every schedule shares the warm-up: `learning_rate` at the end of `warmup_steps`, reached by a linear ramp, or held
throughout with warmup='constant' (GShard's); `decay` says what comes after. Step 0 counts as step 1. A new
schedule is a subclass of `Schedule` under `@SCHEDULES.register("name")`, in any module imported before the config
is read.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gshard_mt.registry import Registry

SCHEDULES = Registry("optimizer.schedule")  # classes


class Schedule:
  """opt_config: the optimizer section (learning_rate, warmup, warmup_steps); total_steps: num_train_steps."""

  def __init__(self, opt_config, total_steps: int):
    self.peak, self.warmup_steps = opt_config.learning_rate, max(opt_config.warmup_steps, 1)
    self.ramp = opt_config.warmup != "constant"
    self.total_steps = total_steps

  def decay(self, lr: jax.Array, step: jax.Array) -> jax.Array:
    """The rate at `step` (float32, >= 1) given the warmed-up rate `lr`."""
    return lr

  def __call__(self, step: jax.Array) -> jax.Array:
    step = jnp.maximum(step.astype(jnp.float32), 1.0)
    lr = self.peak * jnp.minimum(1.0, step / self.warmup_steps) if self.ramp else self.peak
    return self.decay(lr, step)


@SCHEDULES.register("constant")
class Constant(Schedule):
  """The warmed-up rate, held."""


@SCHEDULES.register("rsqrt")
class Rsqrt(Schedule):
  """learning_rate * sqrt(warmup / step) after the warm-up (Vaswani et al. 2017, section 5.3; GShard's
  rsqrt(max(t, 10k)) with learning_rate 0.01 = rsqrt(10k) and 10k warm-up steps held constant)."""

  def decay(self, lr, step):
    return lr * jnp.sqrt(self.warmup_steps / jnp.maximum(step, self.warmup_steps))


def schedule_of(opt_config, total_steps: int) -> Schedule:
  """The schedule optimizer.schedule names."""
  return SCHEDULES.get(opt_config.schedule)(opt_config, total_steps)

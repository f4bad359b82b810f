"""The optimizer, from `config.optimizer` (its learning-rate schedule: `schedules`).

Adafactor is GShard's (arXiv 2006.16668, Appendix A.2: factored second moment, beta1 = 0, second-moment decay
1 - t^-0.8, update clipping 1.0), with the rest as the paper's code set it (Lingvo's XLAShardingAdafactor in
lingvo/tasks/lm/params/synthetic_packed_input.py: multiply_by_parameter_scale=True, epsilon1=1e-30, epsilon2=1e-3,
min_dim_size_to_factor=128), which is Adafactor's own recipe (Shazeer and Stern 2018, Algorithm 4 with relative
step sizes, d = 1, beta2_t = 1 - t^-0.8; the paper's rate, 1.0 x rsqrt(max(t, 10k)), is that paper's
min(1e-2, 1/sqrt(t))). For a weight X with gradient G at step t (from 1):

  V = beta2_t V + (1 - beta2_t) (G^2 + 1e-30)   kept factored (row and column means) over the two largest dims
  U = G / sqrt(V);  U /= max(1, RMS(U))          update clipping at 1.0
  X -= lr_t * max(1e-3, RMS(X)) * U              the step relative to the weight's own scale; no momentum

RMS is over the whole array, so over all units of a scanned stack ([U, ...] weights), where the paper's code took
it per layer. With more experts than M (2048 > 1024), the two largest dims of the experts' [U, E, M, H] weights are
E and H, so one [U, M, H] column statistic is shared by all experts and held whole on every device (as the paper's
code, which also factors the two largest dims).

The chain is optax.adafactor's, with the same state, but one reduction for RMS(X) where optax takes two; tested
equal to optax.clip_by_global_norm then optax.adafactor, as is the fused update (optimizer.kernel; `FusedAdafactor`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from gshard_mt.training.schedules import schedule_of

# optax.adafactor's arguments, each set to the value above (not left to optax's defaults).
ADAFACTOR = dict(
    factored=True,
    min_dim_size_to_factor=128,
    decay_rate=0.8,  # beta2_t = 1 - t^-0.8
    clipping_threshold=1.0,
    multiply_by_parameter_scale=True,  # scale_by_param_rms: max(1e-3, RMS(X))
    momentum=None,  # beta1 = 0: no first moment
    eps=1e-30,
)
PARAM_SCALE_FLOOR = 1e-3  # max(1e-3, RMS(X))


class FusedAdafactor(NamedTuple):
  """An optimizer with Adafactor's fused kernel (optimizer.kernel): the optax chain's init and update, and `apply`,
  (grads, state, params, loss_finite) -> (params, state, the gradient's global norm, finite): the same step in
  kernels that write the parameters in place, and keep everything unless the loss and the norm are finite."""

  init: Callable
  update: Callable
  apply: Callable


def scale_by_param_rms() -> optax.GradientTransformation:
  """optax.scale_by_param_block_rms: U x max(1e-3, RMS(X)), with one reduction over X where optax takes two (its
  second keeps the RMS differentiable at 0, which an optimizer step never needs)."""

  def update(updates, state, params):
    rms = lambda x: jnp.maximum(PARAM_SCALE_FLOOR, jnp.sqrt(jnp.mean(jnp.square(x))))  # noqa: E731
    return jax.tree.map(lambda u, x: u * rms(x).astype(u.dtype), updates, params), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(opt_config, param_specs=None, *, total_steps: int | None = None, adafactor_update=None
                   ) -> optax.GradientTransformation | FusedAdafactor:
  """The configured optimizer behind global-norm clipping (grad_clip_norm; 0 = none), its state one structure
  whatever the clipping and kernel, so a checkpoint restores with any setting. adafactor_update: Adafactor's fused
  kernel the run picked (`ops.Ops.adafactor_update`; None: optax); param_specs: the parameters' PartitionSpecs, for
  that kernel (None: nothing split); total_steps: num_train_steps, for the schedule."""
  schedule = schedule_of(opt_config, total_steps)
  clip = optax.clip_by_global_norm(opt_config.grad_clip_norm) if opt_config.grad_clip_norm else optax.identity()
  if opt_config.name == "adafactor":  # optax.adafactor(schedule, **ADAFACTOR)'s chain (tested equal)
    links = [optax.scale_by_factored_rms(ADAFACTOR["factored"], ADAFACTOR["decay_rate"], 0,
                                         ADAFACTOR["min_dim_size_to_factor"], ADAFACTOR["eps"]),
             optax.clip_by_block_rms(ADAFACTOR["clipping_threshold"]),
             optax.scale_by_learning_rate(schedule, flip_sign=False), scale_by_param_rms()]
    if opt_config.weight_decay:
      links.append(optax.add_decayed_weights(opt_config.weight_decay))
    chain = optax.chain(clip, optax.chain(*links, optax.scale(-1)))
    if adafactor_update is not None:
      return FusedAdafactor(chain.init, chain.update, lambda grads, state, params, loss_finite: _fused_apply(
          grads, state, params, loss_finite, opt_config, schedule, param_specs, adafactor_update))
    return chain
  return optax.chain(clip, optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=opt_config.weight_decay))


def schedule_step(opt_state, step: jax.Array) -> jax.Array:
  """The step the optimizer's learning-rate schedule is at (its ScaleByScheduleState's count): the train `step`
  less the updates skipped (a kept optimizer state keeps its count); `step` for an optimizer without one."""
  is_rate = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
  return next((x.count for x in jax.tree.leaves(opt_state, is_leaf=is_rate) if is_rate(x)), step)


def _fused_apply(grads, state, params, loss_finite, opt_config, schedule, param_specs, adafactor_update):
  """FusedAdafactor.apply, the state in the chain's structure: (clipping, (moments, clipping, rate, scale, ...))."""
  clip_state, links = state
  moments, rate = links[0], links[2]  # optax's FactoredState, ScaleByScheduleState
  d = 1.0 - (moments.count.astype(jnp.float32) + 1.0) ** -ADAFACTOR["decay_rate"]
  settings = dict(eps=ADAFACTOR["eps"], min_dim_size_to_factor=ADAFACTOR["min_dim_size_to_factor"],
                  clipping_threshold=ADAFACTOR["clipping_threshold"], min_scale=PARAM_SCALE_FLOOR)
  params, v_row, v_col, v, norm, finite = adafactor_update(
      grads, params, moments.v_row, moments.v_col, moments.v, param_specs, d=d, lr=schedule(rate.count),
      keep=1.0 - opt_config.weight_decay, clip_norm=opt_config.grad_clip_norm, loss_finite=loss_finite,
      settings=settings)
  count = lambda c: jnp.where(finite, optax.safe_increment(c), c)  # noqa: E731
  links = (moments._replace(count=count(moments.count), v_row=v_row, v_col=v_col, v=v), links[1],
           rate._replace(count=count(rate.count)), *links[3:])
  return params, (clip_state, links), norm, finite

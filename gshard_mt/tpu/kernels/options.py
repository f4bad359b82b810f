"""The kernel options of a run (`pallas` for model.attention, moe.expert_kernel, optimizer.kernel), checked where the
devices are known (`training.setup.build`, only when one is set): off a TPU, a warning that the kernels run
interpreted; on a TPU, the model told the TPU's VMEM, or a one-line error where its kernels would not fit (before
anything compiles)."""

from __future__ import annotations

import dataclasses
import logging

import jax.numpy as jnp

from gshard_mt import config as config_lib
from gshard_mt.errors import ConfigError
from gshard_mt.parallel import chips
from gshard_mt.tpu.kernels import expert_ffn, vmem

log = logging.getLogger(__name__)


def configure(config, model_cfg, device, keys: list[str]):
  """`model_cfg` (a TransformerConfig) for `device` (a jax.Device), the config `keys` being set to 'pallas'."""
  if device.platform != "tpu":
    for key in keys:
      log.warning("%s='pallas' runs its kernels in Pallas's interpret mode off a TPU (%s): for tests, far too slow "
                  "to train with", key, device.platform)
    return model_cfg
  keys = [key for key in keys if key != "optimizer.kernel"]  # the model's kernels
  chip = chips.chip_of(device.device_kind)
  if not keys or chip is None:  # None: a TPU the table does not know, where the compiler decides
    return model_cfg
  itemsize = jnp.dtype(model_cfg.dtype).itemsize
  problems = {
      "model.attention": lambda: vmem.tpu_problem(
          chip.vmem_bytes, config_lib.row_lengths(config), model_cfg.emb_dim, model_cfg.num_heads * model_cfg.head_dim,
          jnp.dtype(model_cfg.residual_dtype).itemsize, itemsize),
      "moe.expert_kernel": lambda: expert_ffn.tpu_problem(chip.vmem_bytes, model_cfg.emb_dim,
                                                             model_cfg.moe.hidden_dim, itemsize)}
  for key in keys:
    if problem := problems[key]():
      raise ConfigError(f"{key}='pallas' on {device.device_kind}: {problem}; use {key}='xla'")
  return dataclasses.replace(model_cfg, kernel_vmem=chip.vmem_bytes)

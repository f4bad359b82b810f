"""The seam between the core and the optional kernels: `pick` reads the config's kernel options once, where the
train state is built (`training.setup.build`), and returns the `ops.Ops` that the model and the training step call.
It is the one place that knows which kernel serves which option, and that refuses, in one line, what a kernel
cannot serve on these devices (before anything compiles):

- model.attention='pallas': the attention block, its layer norm included, in Pallas kernels for TPUs (`attention`);
- moe.expert_kernel='pallas': the experts' ReLU FFN on capacity buffers, with its all-to-alls (`expert_ffn`);
- moe.grouped_kernel='mosaic_gpu': on a Hopper GPU, JAX's Mosaic GPU grouped matmuls (`mosaic_gpu`);
- optimizer.kernel='pallas': Adafactor's update in three kernel passes (`adafactor`);
- optimizer.loss_kernel='pallas': the loss's logit reductions (`logit_stats`).

Off a TPU the Pallas kernels run in Pallas's interpret mode (for tests; a warning says so); on a TPU the model's
kernels are told its VMEM, or refused where they would not fit.
"""

from __future__ import annotations

import functools
import logging

from gshard_mt.config import row_lengths
from gshard_mt.config.platforms import AUTO
from gshard_mt.errors import ConfigError
from gshard_mt.kernels import adafactor, attention, expert_ffn, logit_stats, mosaic_gpu, vmem
from gshard_mt.model.layers import LAYER_NORM_EPSILON
from gshard_mt.moe.experts import PATHS
from gshard_mt.ops import Ops
from gshard_mt.parallel import chips

log = logging.getLogger(__name__)
PALLAS = "pallas"  # the value of a kernel option that asks for this folder's Pallas kernels
ATTENTION_KERNELS = (PALLAS,)  # model.attention's values served here (the model's own: model.layers.ATTENTIONS)
KERNEL_CHOICES = ("xla", PALLAS)  # moe.expert_kernel, optimizer.kernel, optimizer.loss_kernel: XLA's, or ours


def pallas_options(config, model_cfg) -> list[str]:
  """The config keys that ask for Pallas kernels: those whose kernels the model or the update runs; none by
  default. model_cfg: the model's config (`auto` resolved); a dense model has no experts' kernel."""
  experts = model_cfg.moe.expert_kernel if model_cfg.model.moe_interval else ""
  return [key for key, value in (("model.attention", model_cfg.model.attention), ("moe.expert_kernel", experts),
                                 ("optimizer.kernel", config.optimizer.kernel))
          if value == PALLAS]


def pick(config, model_cfg, device) -> Ops:
  """The kernels that `config` asks for, on `device` (a jax.Device; its platform and kind decide)."""
  keys = pallas_options(config, model_cfg)
  if device.platform != "tpu":
    for key in keys:
      log.warning("%s='%s' runs its kernels in Pallas's interpret mode off a TPU (%s): for tests, far too slow "
                  "to train with", key, PALLAS, device.platform)
  capacity = model_vmem(config, model_cfg, device, [k for k in keys if k != "optimizer.kernel"])
  return Ops(
      attention=functools.partial(attention.pallas_attention, vmem=capacity) if "model.attention" in keys else None,
      expert_ffn=functools.partial(expert_ffn.expert_ffn, vmem=capacity) if "moe.expert_kernel" in keys else None,
      grouped_matmuls=grouped_matmuls(model_cfg, device),
      logit_stats=logit_stats.logit_stats if config.optimizer.loss_kernel == PALLAS else None,
      adafactor_update=adafactor.update if "optimizer.kernel" in keys else None)


def model_vmem(config, model_cfg, device, keys: list[str]) -> int | None:
  """The VMEM in bytes of the TPU `device` for the model's kernels of `keys` (None: no TPU, or one the chip table
  does not know, where the compiler decides); a ConfigError where one of them would not fit."""
  chip = chips.chip_of(device.device_kind) if device.platform == "tpu" else None
  if not keys or chip is None:
    return None
  m, itemsize = model_cfg.model, model_cfg.dtype.itemsize
  problems = {
      "model.attention": lambda: vmem.tpu_problem(
          chip.vmem_bytes, row_lengths(config), m.emb_dim, m.num_heads * m.head_dim,
          model_cfg.residual_dtype.itemsize, itemsize),
      "moe.expert_kernel": lambda: expert_ffn.tpu_problem(chip.vmem_bytes, m.emb_dim, model_cfg.moe.hidden_dim,
                                                           itemsize)}
  for key in keys:
    if problem := problems[key]():
      raise ConfigError(f"{key}='{PALLAS}' on {device.device_kind}: {problem}; use {key}='xla'")
  return chip.vmem_bytes


def grouped_matmuls(model_cfg, device) -> mosaic_gpu.MosaicGpu | None:
  """moe.grouped_kernel='mosaic_gpu' on a GPU `device`: the Mosaic GPU kernels, checked for a Hopper GPU and the
  model's shapes; None (XLA's ragged_dot) elsewhere: the weight-gradient kernel asks the device for its number of
  SMs when it is traced, so it cannot be traced for a GPU elsewhere."""
  moe = model_cfg.moe
  if not model_cfg.model.moe_interval or moe.grouped_kernel != "mosaic_gpu" or device.platform != "gpu":
    return None
  mosaic_gpu.check_hopper(device)
  kernels = mosaic_gpu.MosaicGpu()
  kernels.check(model_cfg.model.emb_dim, moe.hidden_dim, model_cfg.dtype)
  return kernels


def check(config) -> None:
  """A ConfigError, in one line naming the keys, where a kernel option asks what its kernel cannot serve (checked
  with the config, before any data is read: `training.validate`)."""
  opt, moe, model = config.optimizer, config.moe, config.model
  if model.attention == PALLAS and (model.bias or model.layer_norm_epsilon != LAYER_NORM_EPSILON):
    raise ConfigError(f"model.attention='{PALLAS}' has no biases and a layer norm epsilon of {LAYER_NORM_EPSILON}: it "
                      f"needs model.bias=False and model.layer_norm_epsilon={LAYER_NORM_EPSILON}, not {model.bias} "
                      f"and {model.layer_norm_epsilon}")
  if opt.kernel == PALLAS and opt.name != "adafactor":
    raise ConfigError(f"optimizer.kernel='{PALLAS}' is Adafactor's update: it needs optimizer.name='adafactor', "
                      f"not {opt.name!r}")
  if not config.model.moe_interval or moe.expert_kernel != PALLAS:
    return
  buffers = tuple(name for name, path in PATHS.items() if path.capacity_buffers)
  if moe.dispatch not in (AUTO, *buffers) or moe.activation != "relu":
    raise ConfigError(f"moe.expert_kernel='{PALLAS}' computes relu(x wi) wo on capacity buffers: it needs "
                      f"moe.activation='relu' and moe.dispatch in {buffers}, not {moe.activation!r} and "
                      f"{moe.dispatch!r}")
  if moe.expert_bias or moe.expert_dropout:
    raise ConfigError(f"moe.expert_kernel='{PALLAS}' has no biases nor output dropout: it needs "
                      f"moe.expert_bias=False and moe.expert_dropout=0, not {moe.expert_bias} and {moe.expert_dropout}")
  if config.partitioning == "expert_model" and config.mesh.model * config.dcn_mesh.model > 1:
    raise ConfigError(f"moe.expert_kernel='{PALLAS}' needs each expert's H whole on a device: "
                      f"partitioning='expert_model' splits it over the model axis, mesh.model={config.mesh.model} x "
                      f"dcn_mesh.model={config.dcn_mesh.model}; use moe.expert_kernel='xla', or a model axis of 1")

"""An HF checkpoint's tensors -> this model's train state, streamed; and this model's parameters -> HF tensors.

The import reads one tensor at a time (`safetensors.tensors`: memory-mapped) into its leaf's host buffer; a leaf
goes to its devices (its sharding's shards) as soon as its last tensor is in, and its buffer is dropped: host
memory stays near one copy of the parameters, whatever their number.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from gshard_mt.data import prepare as prepare_lib
from gshard_mt.data import tokenizer_files
from gshard_mt.errors import WorkdirError
from gshard_mt.hf import names
from gshard_mt.training import validate
from gshard_mt.training.setup import Setup, build, state_rng
from gshard_mt.training.step import TrainState


def read_params(tensors: Iterable[tuple[str, np.ndarray]], abstract: dict, kind: str, unit_size: int, scanned: bool,
                tied: bool, put: Callable[[tuple, np.ndarray], jax.Array]) -> dict:
  """The parameter tree (`abstract`'s structure: ShapeDtypeStructs) filled from (HF name, array) pairs; `put`
  places each finished leaf (path, host array) on its devices. A tensor of the wrong shape, one the model has no
  place for, or a leaf left incomplete is a WorkdirError naming it."""
  shapes = traverse_util.flatten_dict(abstract)
  buffers, missing, done = {}, {}, {}
  for name, array in tensors:
    place = names.tensor_place(name, kind, unit_size, scanned, tied)
    if place is None:
      continue
    path, index, transform = place
    if path not in shapes:
      raise WorkdirError(f"tensor {name!r}: this model has no parameter {'/'.join(path)}")
    shape = shapes[path].shape
    if path not in buffers:
      buffers[path], missing[path] = np.empty(shape, np.float32), math.prod(shape[:len(index)])
    inner = shape[len(index):]
    try:
      buffers[path][index] = names.to_ours(transform, np.asarray(array, np.float32), inner)
    except (ValueError, IndexError):
      raise WorkdirError(f"tensor {name!r} is {list(array.shape)}: {'/'.join(path)} expects {list(inner)} at "
                         f"{list(index)} of {list(shape)}") from None
    missing[path] -= 1
    if not missing[path]:
      done[path] = put(path, buffers.pop(path))
  if absent := [p for p in shapes if p not in done]:
    raise WorkdirError(f"the checkpoint has no tensor for {'/'.join(absent[0])} (and {len(absent) - 1} more "
                       "parameters): another architecture, or an incomplete checkpoint")
  return traverse_util.unflatten_dict(done)


def import_state(setup: Setup, tensors: Iterable[tuple[str, np.ndarray]], kind: str, seed: int) -> TrainState:
  """A step-0 train state whose parameters are the HF checkpoint's `tensors`, with a fresh optimizer."""
  cfg = setup.model_cfg
  param_shardings = traverse_util.flatten_dict(setup.state_shardings.params)
  params = read_params(tensors, setup.abstract_state.params, kind, cfg.unit_size, cfg.model.scan_layers,
                       cfg.model.tied_logits, lambda path, host: jax.device_put(host, param_shardings[path]))
  opt_state = jax.jit(setup.tx.init, out_shardings=setup.state_shardings.opt_state)(params)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state, rng=state_rng(seed))


def run_setup(workdir) -> tuple:
  """(config, tokenizer, setup) of a run, without reading its corpus (evaluate.restore reads it): the tokenizer
  is data.tokenizer, else its prepared corpus's. `evaluate.restore_state` then restores a checkpoint into it."""
  config = validate.load_saved(workdir)
  tokenizer = tokenizer_files.load(config.data.tokenizer or prepare_lib.for_run(config.data, workdir))
  return config, tokenizer, build(config, tokenizer)


def export_tensors(cfg, params: dict) -> Iterable[tuple[str, np.ndarray]]:
  """The HF tensors of a run's parameters (a nested tree, on any devices) for its model config `cfg`, in the order
  HF models name them."""
  flat = {path: np.asarray(jax.device_get(v), np.float32) for path, v in traverse_util.flatten_dict(params).items()}
  kind = names.NLLB_MOE if cfg.model.moe_interval else names.M2M100
  layers = {"encoder": cfg.model.num_encoder_layers, "decoder": cfg.model.num_decoder_layers}
  return names.hf_tensors(flat, kind, layers, cfg.unit_size, cfg.model.scan_layers, cfg.moe.num_experts,
                          cfg.model.tied_logits)

"""The device mesh: its axes, its shape from the config (in-slice ICI and across-slice DCN), and building it."""

from __future__ import annotations

import math

import jax
from jax.experimental import mesh_utils

from gshard_mt import config as config_lib
from gshard_mt.errors import ConfigError, counted
from gshard_mt.parallel import rules as rules_lib

MESH_AXES = ("data", "expert", "model")


def dcn_shape(config) -> tuple[int, int, int]:
  """(data, expert, model): how many slices (the DCN granules: TPU slices, or processes) each mesh axis spans (sizes
  checked by the config)."""
  return tuple(getattr(config.dcn_mesh, a) for a in MESH_AXES)


def ici_shape(config, num_devices: int) -> tuple[int, int, int]:
  """(data, expert, model) within one slice; mesh.data = -1 takes the devices the other axes leave."""
  slices = math.prod(dcn_shape(config))
  if num_devices % slices:
    raise ConfigError(f"dcn_mesh asks for {slices} slices, which does not divide the {num_devices} devices")
  num_devices //= slices
  where = f"the {num_devices} devices" + (f" of each of the {slices} slices (dcn_mesh)" if slices > 1 else "")
  expert, model, data = config.mesh.expert, config.mesh.model, config.mesh.data  # positive, or data = -1 (config)
  if data == -1:
    if num_devices % (expert * model):
      raise ConfigError(f"mesh.expert={expert} x mesh.model={model} does not divide {where}")
    data = num_devices // (expert * model)
  if data * expert * model != num_devices:
    raise ConfigError(f"mesh data={data} x expert={expert} x model={model} = {data * expert * model} does not "
                      f"match {where}")
  return data, expert, model


def mesh_shape(config, num_devices: int) -> tuple[int, int, int]:
  """(data, expert, model) sizes of the whole mesh: the in-slice (ICI) sizes times the DCN sizes."""
  return tuple(i * d for i, d in zip(ici_shape(config, num_devices), dcn_shape(config)))


def make_mesh(config, devices=None) -> jax.sharding.Mesh:
  """The ('data', 'expert', 'model') mesh; with dcn_mesh > 1 a hybrid one whose slices are contiguous blocks, so
  only the axes that span slices cross the slow network."""
  devices = list(devices if devices is not None else jax.devices())
  axis_types = (jax.sharding.AxisType.Auto,) * 3
  dcn, ici = dcn_shape(config), ici_shape(config, len(devices))
  if dcn == (1, 1, 1):
    return jax.make_mesh(ici, MESH_AXES, axis_types=axis_types, devices=devices)
  # TPU devices say which slice they are on; elsewhere (GPU hosts, CPU tests) a process is a slice.
  by_slice = len({getattr(d, "slice_index", None) for d in devices}) > 1
  granules = len({d.slice_index if by_slice else d.process_index for d in devices})
  if granules != math.prod(dcn):
    unit = ("slice", "slices") if by_slice else ("process", "processes")
    raise ConfigError(
        f"dcn_mesh data={dcn[0]} x expert={dcn[1]} x model={dcn[2]} asks for {counted(math.prod(dcn), 'slice')}, but "
        f"the devices ({len(devices)}) are on {counted(granules, *unit)} (one process is one slice off TPU)")
  array = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=not by_slice)
  return jax.sharding.Mesh(array, MESH_AXES, axis_types=axis_types)


def devices_of(config, num_devices: int, logical: str) -> int:
  """How many of `num_devices` the config's mesh and rules split a dimension named `logical` over."""
  sizes = dict(zip(MESH_AXES, mesh_shape(config, num_devices)))
  return rules_lib.devices_of(logical, rules_lib.rules(config), sizes)


def model_sizes(config) -> dict[str, dict[str, int]]:
  """{logical axis: {config key: size}} of the parameters' dimensions a rule table may split: the hidden units
  ('mlp': the dense FFN's unless every FFN is MoE, the experts' unless none is), the heads, the vocabulary."""
  interval = config.model.moe_interval
  mlp = {"model.mlp_dim": config.model.mlp_dim} if interval != 1 else {}
  return {"mlp": mlp | ({"moe.hidden_dim": config.moe.hidden_dim} if interval else {}),
          "heads": {"model.num_heads": config.model.num_heads}, "vocab": {"data.vocab_size": config.data.vocab_size}}


def check(config, num_devices: int):
  """Raises ConfigError where the config does not fit `num_devices`: the mesh, the dimensions the rules split
  (`model_sizes`) over their mesh axes, the rows of a microbatch over the mesh axes the rules give 'batch', the MoE
  groups over those they give 'group'."""
  for logical, sizes in model_sizes(config).items():
    axes, devices = rules_lib.mesh_axes_of(logical, rules_lib.rules(config)), devices_of(config, num_devices, logical)
    for key, size in sizes.items():
      if size % devices:
        where = " x ".join(f"mesh.{a}={getattr(config.mesh, a)} x dcn_mesh.{a}={getattr(config.dcn_mesh, a)}"
                           for a in axes)
        raise ConfigError(f"{key}={size} does not split over the {'/'.join(axes)} axis, {where} "
                          f"(partitioning={config.partitioning!r})")
  batch_devices = devices_of(config, num_devices, "batch")
  if config_lib.microbatch_rows(config) % batch_devices:
    rows = f"batch_size={config.batch_size}" + f" / num_microbatches={config.num_microbatches}" * (
        config.num_microbatches > 1)
    raise ConfigError(f"{rows} does not split over the {batch_devices} devices of the mesh axes the batch is split "
                      "over")
  if error := config_lib.moe_group_error(config, devices_of(config, num_devices, "group")):
    raise ConfigError(error)

"""One training step compiled from abstract values (nothing allocated), and the TPU compiler's cost of it with every
layer counted: the dry run's library (gshard_mt.tools.dryrun is the command).

The compiler's estimate (its cost model's `optimal_seconds`) is a lower bound on time, not a measurement, and it
counts a loop body once. A configured program without loops (unrolled layers, one microbatch) is its own step
time. Otherwise the step time is taken from two or three more compiles of the same model with one and two unrolled
layer units per stack, extended linearly to the configured depth (every unit costs the same): the estimate of a
deeper program grows faster than linearly, so an extension from shallow points understates it.
"""

from __future__ import annotations

import sys
import time

import flax.linen as nn
import jax

from gshard_mt import config as config_lib
from gshard_mt.batch import BATCH_KEYS, FIELDS
from gshard_mt.model.transformer import Transformer, TransformerConfig
from gshard_mt.parallel import chips, shardings
from gshard_mt.tpu.estimates import hlo as hlo_lib
from gshard_mt.tpu.estimates import tpu_compiler as tpu
from gshard_mt.training import metrics
from gshard_mt.training.setup import build


def compile_step(config, devices):
  """(setup, abstract train state, compiled program, lowering seconds, compile seconds) of one training step for
  `devices`, from abstract values."""
  setup = build(config, config.data.vocab_size, devices=devices)
  state = setup.abstract_target()
  batch_sharding = shardings.batch_sharding(setup.mesh, setup.rules)
  lengths = dict(zip(FIELDS, config_lib.row_lengths(config)))
  batch = {k: jax.ShapeDtypeStruct((config.batch_size, lengths[k.split("_")[0]]), jax.numpy.int32,
                                   sharding=batch_sharding) for k in BATCH_KEYS}
  step = setup.jit_train_step(Transformer(setup.model_cfg, deterministic=False), config)
  with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
    start = time.perf_counter()
    lowered = step.lower(state, batch)
    lower_s = time.perf_counter() - start
    start = time.perf_counter()
    program = lowered.compile()
    compile_s = time.perf_counter() - start
  return setup, state, program, lower_s, compile_s


def unit_size(config) -> int:
  return TransformerConfig.from_config(config, config.data.vocab_size).unit_size


def unit_counts(config) -> tuple[int, int]:
  """Layer units (the scanned bodies) in the encoder and in the decoder."""
  return config.model.num_encoder_layers // unit_size(config), config.model.num_decoder_layers // unit_size(config)


def depth_points(units: tuple[int, int]) -> list[tuple[int, int]]:
  """The (encoder, decoder) unit counts to compile so that a step's cost, a + b x encoder units + c x decoder
  units, extends to `units`: (1, 1) and one deeper point per stack deeper than one unit."""
  ne, nd = units
  if ne == nd > 1:
    return [(1, 1), (2, 2)]
  return [(1, 1)] + [(2, 1)] * (ne > 1) + [(1, 2)] * (nd > 1)


def extend_to_depth(costs: dict[tuple[int, int], float], units: tuple[int, int]) -> float:
  """A cost at `units` from its values at `depth_points(units)`, each unit of a stack adding the same."""
  ne, nd = units
  base = costs[(1, 1)]
  if (2, 2) in costs:
    return base + (ne - 1) * (costs[(2, 2)] - base)
  return base + (ne - 1) * (costs.get((2, 1), base) - base) + (nd - 1) * (costs.get((1, 2), base) - base)


def step_time(config, devices, program, points: dict | None = None) -> dict:
  """The TPU compiler's cost of one step with every layer unit counted: that of `program`, the configured model
  compiled, when it has no loops left uncounted or one unit per stack; otherwise that of unrolled compiles at
  `depth_points`, extended to the configured depth. `points` keeps the costs compiled, by depth point, for a
  config that differs from this one only in depth (e.g. the paper's 12L and 36L models).

  Returns {'seconds', 'flops' (per device), 'compiles' (new ones), 'points': {'<encoder units>+<decoder units>'
  or 'configured': {'seconds', 'flops', 'uncounted_loops'}}}, where uncounted_loops are the loops of more than
  one iteration left in that program, whose bodies the compiler counted once (0 when exact)."""
  def cost(program):
    c = tpu.compiler_cost(program)
    loops = sum(1 for t in hlo_lib.loops(program.as_text()).values() if t != 1)
    return {"seconds": c["optimal_seconds"], "flops": c["flops"], "uncounted_loops": loops}

  configured = cost(program)
  units, unit = unit_counts(config), unit_size(config)
  if configured["uncounted_loops"] == 0 or units == (1, 1):
    return {"seconds": configured["seconds"], "flops": configured["flops"], "compiles": 0,
            "points": {"configured": configured}}
  points = {} if points is None else points
  costs, compiles = {}, 0
  for ne, nd in depth_points(units):
    if (ne, nd) not in points:
      compiles += 1
      print(f"step time: compiling {ne} + {nd} unrolled layer units", file=sys.stderr, flush=True)
      points[(ne, nd)] = cost(compile_step(config_lib.replace(config, {
          "model.num_encoder_layers": ne * unit, "model.num_decoder_layers": nd * unit,
          "model.scan_layers": False}), devices)[2])
    costs[(ne, nd)] = points[(ne, nd)]
  return {"seconds": extend_to_depth({p: c["seconds"] for p, c in costs.items()}, units),
          "flops": extend_to_depth({p: c["flops"] for p, c in costs.items()}, units),
          "compiles": compiles, "points": {f"{ne}+{nd}": c for (ne, nd), c in costs.items()}}


def step_time_note(est: dict) -> str:
  """One sentence on how the step time of `tpu_estimates`'s result `est` was found."""
  loops = sum(p["uncounted_loops"] for p in est["depth_points"].values())
  if "configured" in est["depth_points"]:
    how = "the compiler's cost of the configured program"
  else:
    how = (f"the compiler's cost of the model with 1 and 2 unrolled layer units per stack ({est['time_compiles']} "
           "more compiles), extended linearly to the configured depth")
  return (f"Step time: {how}; its FLOPs are {est['step_flops_per_device']:.4g} per device (loops left uncounted: "
          f"{loops}).")


def tpu_estimates(config, devices, program, params, with_time: bool, points: dict | None = None) -> dict:
  """FLOPs per device (loops counted), and with `with_time` the compiler's step time and from it steps/s,
  tokens/s (source and target) and a bound on MFU (the model's FLOPs, `metrics.step_flops`, over time x peak):
  all estimates of the TPU compiler, a lower bound on time, not measurements."""
  chip, peak = chips.chip_of(devices[0].device_kind), chips.peak_flops(devices[0])
  est = tpu.estimate(program)
  sides = [config.batch_size * length for length in config_lib.row_lengths(config)]  # token slots per side, all filled
  tokens, model_flops = sum(sides), metrics.step_flops(params, config.moe, *sides)
  out = {"chip": chip.name, "peak_flops_per_device": peak, "hbm_bytes_per_device": chips.hbm_bytes(devices[0]),
         "flops_per_device": est["flops"], "bytes_accessed_per_device": est["bytes accessed"],
         "compiler_flops_per_device": est["compiler_flops"], "tokens_per_step": tokens,
         "model_flops_per_step": model_flops}
  if with_time:
    t = step_time(config, devices, program, points)
    out.update(step_seconds=t["seconds"], step_flops_per_device=t["flops"], time_compiles=t["compiles"],
               depth_points=t["points"], steps_per_second=1 / t["seconds"],
               tokens_per_second=tokens / t["seconds"],
               mfu_bound=model_flops / (t["seconds"] * peak * len(devices)))
  return out

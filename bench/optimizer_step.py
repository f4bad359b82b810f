"""The optimizer's update alone, as the training step runs it, on the TPU compiler's estimate (not a measurement):
the compiler's optimal_seconds and the per-instruction roofline of one update of every weight of a config, with
its real shapes and shardings.

  python bench/optimizer_step.py --config configs/dense_base.py --topology v5p:2x2x1
  python bench/optimizer_step.py --config configs/base.py --topology v5p:2x2x1 --config.mesh.data=1 \
      --config.mesh.expert=4

The update is `training.step.apply_update` with the training setup's optimizer (`make_optimizer`; with
--config.optimizer.kernel=pallas, Adafactor's update as Pallas kernels), behind the finite check of the gradient's
global norm. --optax compiles optax's own chain instead (optax.clip_by_global_norm then optax.adafactor with the
same settings), for the comparison in docs/decisions.md.
"""

from __future__ import annotations

from gshard_mt import cli
from gshard_mt import config as config_lib
from gshard_mt.errors import UserError


def main(argv):
  args, overrides = config_lib.split_overrides(argv)
  parser = cli.parser(__doc__, config=True)
  parser.add_argument("--topology", default="v5p:2x2x1")
  parser.add_argument("--optax", action="store_true", help="optax's chain instead of make_optimizer's")
  parsed = parser.parse_args(args)
  import jax
  import jax.numpy as jnp
  import optax

  from gshard_mt.tools import dryrun
  from gshard_mt.tpu.estimates import roofline
  from gshard_mt.tpu.estimates import tpu_compiler as tpu
  from gshard_mt.training import optimizer, schedules, step
  from gshard_mt.training.setup import build

  devices = tpu.topology_devices(parsed.topology)
  config = dryrun.load_for(parsed.config, overrides, len(devices))
  setup = build(config, config.data.vocab_size, devices=devices)
  state = setup.abstract_target()
  opt = config.optimizer
  tx = setup.tx
  if parsed.optax:
    if opt.name != "adafactor":
      raise UserError("--optax compares Adafactor: the config's optimizer.name is not 'adafactor'")
    tx = optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm) if opt.grad_clip_norm else optax.identity(),
                     optax.adafactor(schedules.schedule_of(opt, 1000), **optimizer.ADAFACTOR))

  def update(state, grads):
    return step.apply_update(state, grads, tx, jnp.bool_(True))[0]

  with jax.set_mesh(setup.mesh):
    program = jax.jit(update, donate_argnums=0).lower(state, state.params).compile()
  rows = roofline.instruction_costs(program.as_text(), *roofline.compiler_roofline(devices[0]))
  optimal = tpu.compiler_cost(program)["optimal_seconds"]
  which = "optax" if parsed.optax else f"make_optimizer, optimizer.kernel={opt.kernel}"
  print(f"{parsed.config} on {parsed.topology}, {which}: "
        f"compiler's optimal_seconds {optimal * 1e3:.3f} ms, per-instruction sum "
        f"{sum(r['seconds'] for r in rows) * 1e3:.3f} ms, HBM bytes {sum(r['bytes'] for r in rows) / 2**30:.2f} GiB")


if __name__ == "__main__":
  cli.run(main)

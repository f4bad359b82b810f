"""Runs in a subprocess with JAX_NUM_CPU_DEVICES=8 (the test process has one device); prints one JSON object.

For each mesh: one training step's loss, gradients (their norm, and Adam's first moment) and updated parameters,
the collectives of the compiled step, and the per-device shard of an expert weight; then a checkpoint saved on
data 2 x expert 4 restored on other meshes.
"""

import json
import sys
import tempfile

import flax.linen as nn
import jax
import numpy as np
import optax

from gshard_mt.config.moe import MoeConfig
from gshard_mt.data import pipeline
from gshard_mt.model.transformer import Transformer
from gshard_mt.parallel import distributed
from gshard_mt.parallel import mesh as mesh_lib
from gshard_mt.parallel import rules as rules_lib
from gshard_mt.tpu.estimates import hlo as hlo_lib
from gshard_mt.training import checkpoint as checkpoint_lib
from gshard_mt.training.setup import build
from tests.helpers import small_config

MESHES = [(1, 1, 1), (8, 1, 1), (1, 8, 1), (2, 4, 1), (4, 2, 1), (2, 2, 2)]
SHARD_MAP_MESHES = [(8, 1, 1), (2, 4, 1), (2, 2, 2)]
INDEX_GATHER_MESHES = [(2, 4, 1)]  # experts split: where the backward's gathers meet the all-to-alls


def config_for(mesh, dispatch="index"):
  return small_config(**{"moe.num_experts": 8, "moe.group_size": 24, "batch_size": 8, "mesh.data": mesh[0],
                         "mesh.expert": mesh[1], "mesh.model": mesh[2], "moe.dispatch": dispatch,
                         "partitioning": "expert_model" if mesh[2] > 1 else "expert"})


def collective_counts(fn, *args) -> dict:
  """Static count of each collective op in the compiled program."""
  found = hlo_lib.collectives(fn.lower(*args).compile().as_text())
  return {kind: found[kind]["ops"] for kind in ("all-to-all", "all-reduce", "all-gather")}


def layer_collectives(mesh_shape, dispatch, check_vma=True) -> dict:
  """Collectives of one MoE layer's compiled forward and forward + backward (grads of params and input)."""
  import functools

  import jax.numpy as jnp

  from gshard_mt.moe import layer as layer_lib
  from gshard_mt.moe import manual

  layer = layer_lib.MoeFeedForward(MoeConfig(num_experts=8, hidden_dim=32, group_size=16, dispatch=dispatch,
                                             second_expert_policy="all"))
  x = jax.random.normal(jax.random.PRNGKey(0), (8, 32, 16))
  params = nn.unbox(layer.init(jax.random.PRNGKey(1), x))
  original = manual.moe_shard_map
  manual.moe_shard_map = functools.partial(original, check_vma=check_vma)
  try:
    forward = jax.jit(lambda p, x: layer.apply(p, x, deterministic=False)[0])
    both = jax.jit(jax.grad(lambda p, x: jnp.sum(forward(p, x) * jnp.cos(x)), argnums=(0, 1)))
    mesh = jax.make_mesh(mesh_shape, mesh_lib.MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)
    strategy = "expert_model" if mesh_shape[2] > 1 else "expert"
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules_lib.RULES[strategy]):
      return {"forward": collective_counts(forward, params, x), "forward_backward": collective_counts(both, params, x)}
  finally:
    manual.moe_shard_map = original


def first_moment(opt_state):
  """Adam's first moment, in the parameters' tree: after one step it is (1 - b1) times the gradient, clipped to
  the global norm 1 (the clip scale is the same for every leaf, and `grad_norm` gives it)."""
  is_adam = lambda s: isinstance(s, optax.ScaleByAdamState)  # noqa: E731
  return next(s.mu for s in jax.tree.leaves(opt_state, is_leaf=is_adam) if is_adam(s))


def max_relative_diff(tree, reference) -> float:
  """The largest difference of any leaf from its reference, relative to the reference leaf's largest entry."""
  return max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
             for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(reference)))


def main(workdir):
  data = pipeline.load(config_for((1, 1, 1)), workdir)
  batches = [data.train_batches(config_for((1, 1, 1))).batch(i) for i in range(2)]
  out, steps, setups = {"meshes": {}}, {}, {}
  reference = reference_grads = None
  for mesh, dispatch in [(m, "index") for m in MESHES] + [(m, "shard_map") for m in SHARD_MAP_MESHES] + [
      (m, "index_gather") for m in INDEX_GATHER_MESHES]:
    config = config_for(mesh, dispatch)
    setup = build(config, data.tokenizer.vocab_size, devices=jax.devices()[: int(np.prod(mesh))])
    step = setup.jit_train_step(Transformer(setup.model_cfg, deterministic=False), config)
    state = setup.init_state(config.seed)
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
      batch = distributed.global_batch(batches[0], setup.mesh, setup.rules)
      step = step.lower(state, batch).compile()  # compiled once: its program is read, then run
      hlo = step.as_text()
      new, metrics = step(state, batch)
    if dispatch == "index":
      steps[mesh], setups[mesh] = step, setup
    params, grads = jax.device_get((new.params, first_moment(new.opt_state)))
    if reference is None:
      reference, reference_grads = params, grads
    moe = new.params["encoder"]["units"]["layer_1"]["moe"]
    wi = moe["wi"]
    out["meshes"]["x".join(map(str, mesh)) + ("" if dispatch == "index" else f"-{dispatch}")] = {
        "loss": float(metrics["loss"]),
        "max_param_diff": max(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(params),
                                                                          jax.tree.leaves(reference))),
        "grad_norm": float(metrics["grad_norm"]), "max_grad_diff": max_relative_diff(grads, reference_grads),
        "all_to_all": hlo_lib.collectives(hlo)["all-to-all"]["ops"],
        "collective_bytes": sum(c["bytes"] for c in hlo_lib.collectives(hlo).values()),
        "all_gather_of_expert_weights": hlo_lib.gathers_of(hlo, [wi.shape[-3:], moe["wo"].shape[-3:]]),
        "wi_shape": list(wi.shape), "wi_shard_shape": list(wi.addressable_shards[0].data.shape),
    }
  out["layer"] = {f"{'x'.join(map(str, mesh))}-{name}": layer_collectives(mesh, dispatch, check_vma)
                  for mesh in ((2, 4, 1), (2, 2, 2))
                  for name, dispatch, check_vma in (("auto", "index", True), ("manual", "shard_map", True),
                                                    ("manual_no_vma", "shard_map", False))}
  # A checkpoint saved on data 2 x expert 4 restores onto data 8 and onto one device; training continues.
  src = (2, 4, 1)
  with tempfile.TemporaryDirectory() as ckpt_dir:
    setup = setups[src]
    state = setup.init_state(0)
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
      state, _ = steps[src](state, distributed.global_batch(batches[0], setup.mesh, setup.rules))
      with checkpoint_lib.Checkpoints(ckpt_dir, every=1, async_save=False) as ckpts:
        ckpts.save(1, state, {"seed": 0, "next_index": 1})
      _, m = steps[src](state, distributed.global_batch(batches[1], setup.mesh, setup.rules))
    out["restore"] = {"2x4x1": float(m["loss"])}
    for dst in ((8, 1, 1), (1, 1, 1)):
      setup = setups[dst]
      with checkpoint_lib.Checkpoints(ckpt_dir) as ckpts:
        _, restored, _ = ckpts.restore(setup.abstract_target())
      with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        _, m = steps[dst](restored, distributed.global_batch(batches[1], setup.mesh, setup.rules))
      leaf = restored.params["encoder"]["units"]["layer_1"]["moe"]["wi"]
      out["restore"]["x".join(map(str, dst))] = float(m["loss"])
      out["restore"][f"devices_{'x'.join(map(str, dst))}"] = len(leaf.sharding.device_set)
  print("RESULT " + json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1])

"""optimizer.kernel='pallas' (Adafactor's update as Pallas kernels, `training.fused_adafactor`; Pallas's interpret
mode on the CPU) against make_optimizer's optax chain (itself tested equal to optax.adafactor): parameters, moments,
counts and the global norm over steps with and without clipping and weight decay, for weights factored either
way, stacked, not factored (in their TPU layout's view) and left to jnp; nothing changes on a non-finite step;
which weights take kernels; per device under shard_map on a mesh; the training step either way; Mosaic compiles
them for a v5p, pinned to HBM, charged their declared bytes."""

import functools
import logging

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from gshard_mt.errors import ConfigError
from gshard_mt.kernels import adafactor as fused_adafactor
from gshard_mt.training import optimizer
from gshard_mt.training.optimizer import FusedAdafactor
from tests.helpers import run_on_cpu_devices, small_config

# name -> (shape, whether it takes kernels). Factored over its last two dims with the largest last ("wide") or
# first ("tall"), stacked ([E, M, H] and [E, H, M]); not factored with a last dim under 128 (viewed as the TPU
# lays it out) or over; left to jnp: a vector, a small matrix, factored dims that are not the last two.
SHAPES = {"wide": ((256, 512), True), "tall": ((512, 128), True), "stack": ((4, 128, 256), True),
          "stack_t": ((4, 256, 128), True), "heads": ((256, 4, 64), True), "heads_t": ((4, 64, 256), True),
          "vector": ((512,), False), "small": ((64, 200), False), "apart": ((256, 2, 128), False)}


def make_optimizer(opt_config, specs=None):
  """The optimizer the training setup builds: with optimizer.kernel='pallas', the kernels' seam's Adafactor."""
  update = fused_adafactor.update if opt_config.kernel == "pallas" else None
  return optimizer.make_optimizer(opt_config, specs, adafactor_update=update)


def opt_config(kernel: str, **kw):
  values = dict(name="adafactor", learning_rate=0.01, schedule="rsqrt", warmup="constant", warmup_steps=1,
                grad_clip_norm=1.0, weight_decay=0.0, kernel=kernel)
  return ml_collections.ConfigDict({**values, **kw})


def weights(seed: int, scale: float = 1.0) -> dict:
  rng = np.random.default_rng(seed)
  return {k: jnp.asarray(rng.normal(size=shape) * scale, jnp.float32) for k, (shape, _) in SHAPES.items()}


@pytest.fixture
def small_blocks(monkeypatch):
  """Blocks of 16 KiB, so that every kernel weight spans several blocks."""
  monkeypatch.setattr(fused_adafactor, "BLOCK_BYTES", 1 << 14)


@pytest.mark.parametrize("settings", [dict(), dict(weight_decay=0.1), dict(grad_clip_norm=1e4)],
                         ids=["clipped", "weight-decay", "unclipped"])
def test_the_kernels_make_the_chains_steps(settings, small_blocks):
  params = weights(0)
  chain, fused = make_optimizer(opt_config("xla", **settings)), make_optimizer(opt_config("pallas", **settings))
  assert isinstance(fused, FusedAdafactor)
  ours, theirs = fused.init(params), chain.init(params)
  assert jax.tree.structure(ours) == jax.tree.structure(theirs)  # checkpoints restore with either setting
  p_ours = p_theirs = params
  apply = jax.jit(fused.apply)
  for step in range(3):
    grads = weights(10 + step, scale=0.01 if step == 0 else 3.0)  # clipped from the second step
    updates, theirs = chain.update(grads, theirs, p_theirs)
    p_theirs = optax.apply_updates(p_theirs, updates)
    p_ours, ours, norm, finite = apply(grads, ours, p_ours, jnp.bool_(True))
    assert bool(finite)
    np.testing.assert_allclose(norm, optax.tree.norm(grads), rtol=1e-6)
    for k in SHAPES:  # the step relative to its size (the weights move by up to ~lr per element)
      step_size = float(jnp.max(jnp.abs(p_theirs[k] - params[k])))
      np.testing.assert_allclose(p_ours[k], p_theirs[k], rtol=0, atol=2e-5 * step_size, err_msg=f"{step} {k}")
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=0)


@pytest.mark.parametrize("bad", ["loss", "gradient"])
def test_nothing_changes_on_a_step_that_is_not_finite(bad, small_blocks):
  params = weights(0)
  fused = make_optimizer(opt_config("pallas"))
  state = fused.init(params)
  grads = weights(1)
  if bad == "gradient":
    grads["stack"] = grads["stack"].at[1, 2, 3].set(jnp.nan)
  new_params, new_state, norm, finite = jax.jit(fused.apply)(grads, state, params, jnp.bool_(bad != "loss"))
  assert not bool(finite) and (bad == "loss") == bool(jnp.isfinite(norm))
  for a, b in zip(jax.tree.leaves((new_params, new_state)), jax.tree.leaves((params, state))):
    np.testing.assert_array_equal(a, b)  # counts included: the schedule does not advance


def test_which_weights_take_kernels_and_their_views():
  one = AbstractMesh((1,), ("data",))
  plan = lambda name: fused_adafactor._plan(jnp.zeros(SHAPES[name][0]), P(), one, 128)  # noqa: E731
  assert {k: plan(k).rows is not None for k in SHAPES} == {k: kernel for k, (_, kernel) in SHAPES.items()}
  assert plan("heads").order == (1, 2, 0) and plan("heads").dims == (1, 256, 256)  # [256, 4, 64] is [4, 64, 256]
  assert plan("stack_t").dims == (4, 256, 128) and plan("heads_t").dims == (1, 256, 256)
  mesh = AbstractMesh((4, 2), ("expert", "model"))
  x = jnp.zeros((8, 128, 256))
  assert fused_adafactor._plan(x, P("expert"), mesh, 128).dims == (2, 128, 256)  # per device
  assert fused_adafactor._plan(x, P(None, "model"), mesh, 128).rows is None  # a factored dim split: jnp
  # a block is a multiple of 8 rows within one [S, L] matrix, or the whole view
  assert fused_adafactor._rows_per_block(2, 20, 512) is None and fused_adafactor._rows_per_block(1, 20, 512) == 20


def test_the_kernels_run_per_device_on_a_mesh():
  run_on_cpu_devices("tests.unit.test_fused_adafactor", "mesh_check")


def mesh_check():
  """On 4 CPU devices (expert 2 x data 2): the stacked weights split over 'expert', the others replicated; the
  result is the chain's."""
  fused_adafactor.BLOCK_BYTES = 1 << 14
  mesh = jax.make_mesh((2, 2), ("expert", "data"), axis_types=(jax.sharding.AxisType.Auto,) * 2)  # as training's
  specs = {k: P("expert") if k.startswith("stack") else P() for k in SHAPES}
  params, grads = weights(0), weights(1, scale=3.0)
  chain, fused = make_optimizer(opt_config("xla")), make_optimizer(opt_config("pallas"), specs)
  updates, _ = chain.update(grads, chain.init(params), params)
  expected = optax.apply_updates(params, updates)
  with jax.set_mesh(mesh):
    put = lambda tree: jax.tree.map(lambda x, s: jax.device_put(x, jax.NamedSharding(mesh, s)), tree, specs)  # noqa: E731
    got, _, _, _ = jax.jit(fused.apply)(put(grads), fused.init(params), put(params), jnp.bool_(True))
  for k in SHAPES:
    np.testing.assert_allclose(got[k], expected[k], rtol=0, atol=1e-6, err_msg=k)
  print("OK")


def test_the_training_step_takes_either_path(monkeypatch):
  """A tiny MoE model's step (selection biases set by their rule, weight decay) with every weight through the
  kernels against the chain: the same loss, norm, biases, parameters and moments. One step: in a second, an
  expert that got no gradient in the first (V = 1e-30) turns the paths' rounding differences into steps of ~lr."""
  from tests.unit.test_balance import _bias_step

  monkeypatch.setattr(fused_adafactor, "MIN_KERNEL_SIZE", 1)
  results = {}
  for kernel in ("xla", "pallas"):
    state, batch, step = _bias_step(make_optimizer(opt_config(kernel, weight_decay=0.1)))
    results[kernel] = step(state, batch)
  (xla, xla_metrics), (ours, our_metrics) = results["xla"], results["pallas"]
  for key in ("loss", "grad_norm", "finite"):
    np.testing.assert_allclose(our_metrics[key], xla_metrics[key], rtol=1e-6, err_msg=key)
  for a, b in zip(jax.tree.leaves((ours.params, ours.opt_state)), jax.tree.leaves((xla.params, xla.opt_state))):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert int(ours.step) == 1


def test_build_warns_that_it_is_interpreted_off_a_tpu(caplog):
  from gshard_mt.training.setup import build

  with caplog.at_level(logging.WARNING, logger="gshard_mt.kernels.seam"):
    build(small_config(**{"optimizer.name": "adafactor", "optimizer.kernel": "pallas"}), 600)
  assert "optimizer.kernel='pallas' runs its kernels in Pallas's interpret mode off a TPU (cpu)" in caplog.text


def test_pallas_needs_adafactor():
  with pytest.raises(ConfigError, match="optimizer.kernel='pallas' is Adafactor's update"):
    small_config(**{"optimizer.name": "adam", "optimizer.kernel": "pallas"})


def test_the_kernels_compile_for_a_tpu_and_are_charged_their_bytes():
  """On a v5p (libtpu's compile-only device), dense_base's FFN weights: one Mosaic kernel per pass, neither weight
  copied into VMEM ahead of them, and the compiler's estimate within 1.5x the bytes they declare: 1.31x here, the
  rest the small sums between the passes (weights that XLA prefetches into VMEM are charged about twice that)."""
  from gshard_mt.tpu.estimates import hlo, roofline
  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  device = tpu.topology_devices("v5p:1x1x1")[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  shapes = {"wi": (512, 3072), "wo": (3072, 512)}
  params = {k: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding) for k, shape in shapes.items()}
  fused = make_optimizer(opt_config("pallas"))
  state = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
                       jax.eval_shape(fused.init, params))
  program = jax.jit(functools.partial(fused.apply, loss_finite=True), donate_argnums=(1, 2)).lower(
      params, state, params).compile()
  text = program.as_text()
  assert text.count('custom_call_target="tpu_custom_call"') == 3 * len(shapes)
  prefetched = [line for line in text.splitlines() if "copy-start(" in line and "S(1)" in line]
  assert not [line for line in prefetched if any(f"f32[{a},{b}]" in line for a, b in shapes.values())]
  declared = sum(int(m["bytes"]) for m in hlo.DECLARED.finditer(text))
  _, bandwidth = roofline.compiler_roofline(device)
  assert tpu.compiler_cost(program)["optimal_seconds"] < 1.5 * declared / bandwidth

"""Model building blocks: masks, shift right, attention probabilities, beams grouped per sentence."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.model import layers
from gshard_mt.parallel import einsum


def test_attention_bias_masks_other_segments_padding_and_the_future():
  segments = jnp.array([[1, 1, 2, 0]])
  bias = np.asarray(layers.attention_bias(segments, segments, causal=True))[0, 0]
  allowed = bias == 0
  expected = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], bool)
  np.testing.assert_array_equal(allowed, expected)
  assert (bias[~allowed] == layers.NEG_INF).all()
  full = np.asarray(layers.attention_bias(segments, segments, causal=False))[0, 0] == 0
  np.testing.assert_array_equal(full, np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], bool))


def test_source_bias_hides_padding_only():
  bias = np.asarray(layers.source_bias(jnp.array([[1, 1, 0], [1, 0, 0]])))
  assert bias.shape == (2, 1, 1, 3)
  np.testing.assert_array_equal(bias[:, 0, 0] == 0, [[True, True, False], [True, False, False]])


def test_shift_right_starts_each_packed_pair_from_pad():
  targets = jnp.array([[5, 6, 7, 8, 9, 0]])
  segments = jnp.array([[1, 1, 1, 2, 2, 0]])
  np.testing.assert_array_equal(layers.shift_right(targets, segments), [[0, 5, 6, 0, 8, 0]])


def test_attention_probs_against_numpy():
  rng = np.random.default_rng(0)
  q, k = rng.normal(size=(2, 3, 2, 4)), rng.normal(size=(2, 5, 2, 4))
  bias = np.where(rng.random((2, 1, 3, 5)) < 0.3, layers.NEG_INF, 0.0)
  bias[..., 0] = 0.0  # every query sees at least one key
  logits = np.einsum("bqad,bkad->baqk", q, k) + bias
  expected = np.exp(logits - logits.max(-1, keepdims=True))
  expected /= expected.sum(-1, keepdims=True)
  np.testing.assert_allclose(layers.attention_probs(jnp.asarray(q), jnp.asarray(k), jnp.asarray(bias)), expected,
                             rtol=1e-5, atol=1e-6)


def test_per_sentence_groups_adjacent_beams_as_queries():
  q = jnp.arange(6 * 1 * 2 * 3).reshape(6, 1, 2, 3)  # 2 sentences x 3 beams, one step
  grouped = layers.per_sentence(q, 2)
  assert grouped.shape == (2, 3, 2, 3)
  np.testing.assert_array_equal(grouped[1, 2], q[5, 0])  # sentence 1, beam 2 is row 5
  np.testing.assert_array_equal(grouped.reshape(q.shape), q)


def test_dense_ffn_is_relu_mlp():
  ffn = layers.DenseFFN(mlp_dim=8)
  x = jax.random.normal(jax.random.key(0), (2, 3, 4))
  params = ffn.init(jax.random.key(1), x, deterministic=True)
  wi, wo = (np.asarray(params["params"][n].value) for n in ("wi", "wo"))
  expected = np.maximum(np.asarray(x) @ wi, 0) @ wo
  np.testing.assert_allclose(ffn.apply(params, x, deterministic=True), expected, rtol=1e-5, atol=1e-5)


def test_normalize_is_the_layer_norm_module_and_norm_params_its_parameters():
  """`normalize` with `NormParams` computes what `layer_norm` (flax's LayerNorm) does, on float32 and bf16 rows
  (the residual stream's dtypes), with the same parameter names, shapes and initial values."""
  rng = np.random.default_rng(0)
  x32 = jnp.asarray(rng.normal(size=(2, 5, 16)) * 3 + 1, jnp.float32)
  module, norm = layers.layer_norm("n"), layers.NormParams(16)
  params = module.init(jax.random.key(0), x32)
  assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, norm.init(jax.random.key(0)))
  np.testing.assert_array_equal(*(jax.tree.leaves(nn.unbox(p)) for p in (params, norm.init(jax.random.key(0)))))
  scale, bias = (jnp.asarray(rng.normal(size=16), jnp.float32) for _ in range(2))
  trained = {"params": {"scale": scale, "bias": bias}}
  for x in (x32, x32.astype(jnp.bfloat16)):
    want = module.apply(trained, x)
    got = layers.normalize(x, scale, bias)
    assert got.dtype == want.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("equation, x_shape, w_shape", [
    ("BLM,MF->BLF", (2, 3, 8), (8, 16)), ("EGCM,EMH->EGCH", (4, 2, 3, 8), (4, 8, 16)),
    ("BQM,MAD->BQAD", (2, 3, 8), (8, 2, 4)), ("BQAD,ADM->BQM", (2, 3, 2, 4), (2, 4, 8))])
def test_weight_einsum_is_the_einsum_with_a_float32_weight_gradient(equation, x_shape, w_shape):
  """float32: the einsum's value and gradients. bf16 x: the same value and x gradient as jnp.einsum with the weight
  cast, and a float32 weight gradient at least as close to the float64 one as the einsum's bf16-rounded one."""
  rng = np.random.default_rng(0)
  x, w = rng.normal(size=x_shape), rng.normal(size=w_shape)
  dy = rng.normal(size=jax.eval_shape(lambda: jnp.einsum(equation, x, w)).shape)

  def value_and_grads(f, x):
    y, vjp = jax.vjp(f, x, jnp.asarray(w, jnp.float32))
    return (y, *vjp(jnp.asarray(dy, y.dtype)))

  ours = lambda x: value_and_grads(lambda x, w: einsum.weight_einsum(equation, x, w), x)  # noqa: E731
  theirs = lambda x: value_and_grads(lambda x, w: jnp.einsum(equation, x, w.astype(x.dtype)), x)  # noqa: E731
  for a, b in zip(ours(jnp.asarray(x, jnp.float32)), theirs(jnp.asarray(x, jnp.float32))):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  (y, dx, dw), (y_ref, dx_ref, dw_ref) = ours(jnp.asarray(x, jnp.bfloat16)), theirs(jnp.asarray(x, jnp.bfloat16))
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(y_ref, np.float32))
  np.testing.assert_allclose(np.asarray(dx, np.float32), np.asarray(dx_ref, np.float32), rtol=1e-2, atol=1e-2)
  assert dw.dtype == jnp.float32
  xs, rest = equation.split(",")
  exact = np.einsum(f"{xs},{rest.split('->')[1]}->{rest.split('->')[0]}",
                    np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64), np.asarray(jnp.asarray(dy, jnp.bfloat16),
                                                                                       np.float64))
  assert np.abs(np.asarray(dw) - exact).max() <= np.abs(np.asarray(dw_ref, np.float64) - exact).max()
  assert np.abs(np.asarray(dw) - exact).max() < 1e-4


@pytest.mark.parametrize("split", ["rows", "weight"])
def test_weight_einsum_under_shard_map_sums_gradients_as_autodiff_does(split):
  """Rows split over a mesh axis and the weight whole (invariant), or the other way round: the whole operand's
  gradient is summed over the axis, as jnp.einsum's autodiff sums it (the gradient's type must match its
  operand's for shard_map's checks)."""
  from jax.sharding import PartitionSpec as P

  specs = (P("data"), P()) if split == "rows" else (P(), P(None, "data"))
  mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  rng = np.random.default_rng(0)
  x, w = jnp.asarray(rng.normal(size=(4, 8)), jnp.float32), jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)

  def grads(einsum):
    loss = jax.shard_map(lambda x, w: jax.lax.psum(jnp.sum(einsum("BM,MF->BF", x, w) ** 2), "data"), mesh=mesh,
                         in_specs=specs, out_specs=P())
    return jax.grad(loss, (0, 1))(x, w)

  for ours, theirs in zip(grads(einsum.weight_einsum), grads(jnp.einsum)):
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)

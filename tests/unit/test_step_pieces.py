"""bench/step_pieces.py's pieces trace at their shapes (their TPU compiles are left to the script): each piece's
forward + backward is well-formed, so the script keeps running as the model's functions change."""

import sys

import jax
import jax.numpy as jnp

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import step_pieces  # noqa: E402


def test_every_piece_traces_forward_and_backward():
  pieces = step_pieces.pieces(jnp, jax)
  assert len(pieces) == 8
  for name, (fn, shapes) in pieces.items():
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
    grads = jax.eval_shape(step_pieces.forward_backward(jax, jnp, fn, shapes), *args)
    floating = [shape for shape, dtype in shapes if dtype != jnp.int32]
    assert [g.shape for g in grads] == floating, name


def test_matmul_chains_count_their_flops():
  chains = step_pieces.matmul_chains(jnp, 64, [(32, 32), (32, 96)], length=4)
  for (K, N), (fn, shapes, flops) in chains.items():
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
    assert jax.eval_shape(fn, *args).shape == (64, K if K != N else N)
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    assert flops == 2 * 64 * K * N * 4 <= cost["flops"] < 1.05 * flops  # XLA's count adds the weights' offsets


def test_row_sums_read_their_bytes():
  sums = step_pieces.row_sums(jnp, 8, [4, 16])
  assert sorted(sums) == [(4, "bfloat16"), (4, "float32"), (16, "bfloat16"), (16, "float32")]
  fn, [(shape, dtype)], nbytes = sums[(16, "bfloat16")]
  assert shape == (16, 8) and nbytes == 16 * 8 * 2
  x = jnp.arange(128, dtype=dtype).reshape(shape)
  assert fn(x).dtype == jnp.float32 and float(fn(x)[1]) == sum(range(8, 16))


def test_layer_chains_trace_for_every_variant():
  for _, overrides in step_pieces.LAYER_VARIANTS:
    fn, shapes = step_pieces.layer_chain(jax, jnp, overrides, 2)
    _, x, _ = shapes
    d_params, d_x = jax.eval_shape(fn, *step_pieces.abstract(jax, shapes, None))
    assert sorted(d_params["params"]) == ["layer_0", "layer_1"] and d_x.shape == x[0] == (128, 64, 512)

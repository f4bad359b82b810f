"""The einsum of activations with float32 weights that every layer uses (attention, the dense FFN, the experts),
exact inside shard_map as outside (the manual MoE path)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def weight_einsum(equation: str, x: jax.Array, w: jax.Array) -> jax.Array:
  """einsum(equation, x, w) with the float32 weight w cast to x's dtype, whose gradient in w comes out of the matmul
  in float32 (its accumulator), not rounded to x's dtype and cast back: one pass less over every weight's gradient,
  and a more precise one. `equation`: 'x,w->y', a matmul. Inside shard_map each operand is first marked varying
  over the mesh axes the other varies over, as jnp.einsum does, so that the mark's transpose sums the gradient."""
  x_axes, w_axes = (jax.typeof(a).manual_axis_type.varying for a in (x, w))
  spread = lambda a, axes: jax.lax.pcast(a, tuple(sorted(axes)), to="varying") if axes else a  # noqa: E731
  return _weight_einsum(equation, spread(x, w_axes - x_axes), spread(w, x_axes - w_axes))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _weight_einsum(equation: str, x: jax.Array, w: jax.Array) -> jax.Array:
  return jnp.einsum(equation, x, w.astype(x.dtype))


def _weight_einsum_forward(equation, x, w):
  return _weight_einsum(equation, x, w), (x, w)


def _weight_einsum_backward(equation, residuals, dy):
  x, w = residuals
  xs, rest = equation.split(",")
  ws, ys = rest.split("->")
  return (jnp.einsum(f"{ys},{ws}->{xs}", dy, w.astype(x.dtype)),
          jnp.einsum(f"{xs},{ys}->{ws}", x, dy, preferred_element_type=w.dtype))


_weight_einsum.defvjp(_weight_einsum_forward, _weight_einsum_backward)

"""What the package's Pallas kernels for TPUs share (attention, the experts' FFN, Adafactor's passes, the loss):
their matmul, accumulating in float32, with its dimension numbers, and where a kernel runs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

NN = (((1,), (0,)), ((), ()))  # x y
NT = (((1,), (1,)), ((), ()))  # x y^T
TN = (((0,), (0,)), ((), ()))  # x^T y


def dot(x, y, dims=NN):
  return jax.lax.dot_general(x, y, dims, preferred_element_type=jnp.float32)


def on_tpu(run, *args, pin_from: int = 0, elsewhere=None):
  """`run(interpret=False)` compiled for a TPU; for any other platform `elsewhere` (default: Pallas's interpret
  mode, `run(True)`): chosen where the program is lowered, not by the host's default backend (a TPU program
  compiled ahead of time on a CPU host gets the kernels). On a TPU the args from `pin_from` on stay in HBM, where
  the kernel's blocks stream from: left to it, the compiler copies whole operands into VMEM ahead of a call,
  which its estimate charges at about twice the call (docs/decisions.md)."""
  def pinned(*args):
    return run(False)(*args[:pin_from], *(pltpu.with_memory_space_constraint(x, pltpu.HBM)
                                          for x in args[pin_from:]))
  return jax.lax.platform_dependent(*args, tpu=pinned, default=elsewhere or run(True))

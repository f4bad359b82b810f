"""The operations where an optional kernel may stand in for XLA's reference path, behind one interface: `Ops`,
picked once where the train state is built (`gshard_mt.kernels.seam.pick`, from what the config asks for) and
carried by the model's config to the layers and the training step. Each field None: the reference path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Ops:
  """The kernels a run uses (None: XLA's reference path)."""

  # The whole attention block (its layer norm too): (x [B, Q, M], kv [B, K, M] or None, norm (scale, bias),
  # weights (wq, wk, wv, wo), q_segments [B, Q], k_segments [B, K], *, causal, dtype) -> [B, Q, M]. With it the
  # model hands the attention the segment ids instead of a mask.
  attention: Callable | None = None
  # The experts' ReLU FFN on capacity buffers: (buffers [E, G, C, M], wi, wo, buffer_axes, weight_axes) -> [E, G,
  # C, M]; experts with biases are refused where the kernel is picked.
  expert_ffn: Callable | None = None
  # moe.dispatch='grouped': an object with by_weights and by_rows (grouped.RaggedDot's interface).
  grouped_matmuls: Any = None
  # The loss's per-position reductions: (logits [B, L, V], targets [B, L]) -> (lse, target logit, logit sum, argmax).
  logit_stats: Callable | None = None
  # Adafactor's whole update: (grads, state, params, loss_finite, opt_config, schedule, param_specs) -> (params,
  # state, the gradient's global norm, finite), the state in optax's chain's structure.
  adafactor_update: Callable | None = None

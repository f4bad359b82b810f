"""Metrics: per-layer MoE summaries (on device), FLOPs / MFU estimates, and the writer (JSONL + TensorBoard).

Training metrics stay on the device until a log step, so the host never waits for the device every step.
"""

from __future__ import annotations

import json
import math
import os
import pathlib

import jax
import jax.numpy as jnp

# Peak dense bf16 FLOP/s per device, for the MFU estimate; unknown devices (CPUs) report no MFU.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "TPU v3": 123e12, "TPU v4": 275e12,
              "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12}


def moe_summary(stats: dict) -> dict:
  """{'encoder'|'decoder': layer stats stacked over MoE layers [U]} -> flat scalars per MoE layer.

  For each layer: dropped fraction of top-1 and top-2 assignments, the expert load's min / max / coefficient
  of variation (load = fraction of kept assignments per expert; 1/E each when balanced), and the load itself
  (`.../load`, [E]; the step logger writes it to expert_load.jsonl, not with the scalars).
  """
  out = {}
  for side, s in stats.items():
    if not s:
      continue
    load = s["metrics"]["expert_load"]  # [U, E]
    cv = jnp.std(load, axis=-1) / jnp.maximum(jnp.mean(load, axis=-1), 1e-9)
    for u in range(load.shape[0]):
      prefix = f"moe/{side}_{u}"
      out[f"{prefix}/top1_dropped"] = s["metrics"]["top1_dropped"][u]
      out[f"{prefix}/top2_dropped"] = s["metrics"]["top2_dropped"][u]
      out[f"{prefix}/load_min"] = load[u].min()
      out[f"{prefix}/load_max"] = load[u].max()
      out[f"{prefix}/load_cv"] = cv[u]
      out[f"{prefix}/load"] = load[u]
  return out


def total_moe_losses(stats: dict) -> tuple[jax.Array, jax.Array]:
  """Sums of the aux losses and of the z-losses over all MoE layers (0 for a dense model)."""
  aux = sum((jnp.sum(s["aux_loss"]) for s in stats.values() if s), jnp.zeros((), jnp.float32))
  z = sum((jnp.sum(s["z_loss"]) for s in stats.values() if s), jnp.zeros((), jnp.float32))
  return aux, z


def active_params(params, num_experts: int) -> float:
  """Parameters a token uses: everything outside the experts, plus 2 of the E experts of each MoE layer."""
  total = 0.0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = [getattr(k, "key", "") for k in path]
    is_expert = "moe" in names and names[-1] in ("wi", "wo")
    total += leaf.size * (2 / num_experts if is_expert else 1.0)
  return total


def step_flops(params, num_experts: int, source_tokens: float, target_tokens: float) -> float:
  """Model FLOPs of a training step, 6 per active parameter and token it touches (forward and backward): the
  encoder's for each source token, the decoder's and the output projection's (V x M) for each target token.
  Embedding look-ups are no matmuls; attention's score FLOPs are left out, as in the usual 6N count."""
  logits = params["logits"] if "logits" in params else params["embed"]["embedding"]
  encoder = active_params(params["encoder"], num_experts)
  decoder = active_params(params["decoder"], num_experts) + logits.size
  return 6 * (encoder * source_tokens + decoder * target_tokens)


def mfu(flops_per_second: float, device_kind: str, num_devices: int) -> float | None:
  for name, peak in PEAK_FLOPS.items():
    if name.lower() in device_kind.lower():
      return flops_per_second / (peak * num_devices)
  return None


class Writer:
  """Appends one JSON object per logged step to workdir/metrics.jsonl and mirrors scalars to TensorBoard."""

  def __init__(self, workdir: str | pathlib.Path, enabled: bool = True):
    self.enabled = enabled
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self.tb = None
    if enabled:
      from tensorboardX import SummaryWriter  # writes event files without TensorFlow
      self.tb = SummaryWriter(str(pathlib.Path(workdir) / "tensorboard"))

  def write(self, step: int, values: dict):
    if not self.enabled:
      return
    row = {"step": int(step)}
    for k, v in values.items():
      v = float(v) if v is not None else None
      row[k] = None if v is not None and not math.isfinite(v) else v
      if row[k] is not None:
        self.tb.add_scalar(k, row[k], step)
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
      f.flush()
      os.fsync(f.fileno())

  def write_vectors(self, step: int, vectors: dict):
    """Appends {'step', name: [values]} to workdir/expert_load.jsonl; TensorBoard gets each as a histogram."""
    if not self.enabled or not vectors:
      return
    row = {"step": int(step)} | {k: [float(x) for x in v] for k, v in vectors.items()}
    for k, v in vectors.items():
      self.tb.add_histogram(k, v, step)
    with open(self.path.with_name("expert_load.jsonl"), "a") as f:
      f.write(json.dumps(row) + "\n")

  def close(self):
    if self.tb is not None:
      self.tb.close()

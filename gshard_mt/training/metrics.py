"""Metrics: per-layer MoE summaries (on device), FLOPs / MFU estimates, and the writer (JSONL + TensorBoard).

Training metrics stay on the device until a log step, so the host never waits for the device every step.
"""

from __future__ import annotations

import json
import math
import os
import socket
import struct
import time

import jax
import jax.numpy as jnp
import numpy as np
from tensorboardX import summary
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from gshard_mt import io
from gshard_mt.moe import gating, routers
from gshard_mt.parallel import chips


def moe_summary(stats: dict) -> dict:
  """{'encoder'|'decoder': layer stats stacked over MoE layers [U]} -> `moe/<side>_<u>/<name>` per MoE layer, the
  same for every router: the fractions of first and of later choices that capacity dropped (`top1_dropped`,
  `top2_dropped`; for expert choice, first = tokens no expert took), the kept load's min / max / coefficient of
  variation (load: the fraction of kept assignments per expert, 1/E each when balanced), and the [E] vectors `load`
  and `requested_load` (asked of each expert before capacity), which the step logger writes to expert_load.jsonl.
  """
  out = {}
  for side, s in stats.items():
    if not s:
      continue
    load = s["metrics"]["expert_load"]  # [U, E]
    cv = jnp.std(load, axis=-1) / jnp.maximum(jnp.mean(load, axis=-1), 1e-9)
    first, later = gating.dropped_fractions(s["metrics"])  # [U] each
    for u in range(load.shape[0]):
      layer = {"top1_dropped": first[u], "top2_dropped": later[u], "load_min": load[u].min(),
               "load_max": load[u].max(), "load_cv": cv[u], "load": load[u],
               "requested_load": s["metrics"]["requested_load"][u]}
      out |= {f"moe/{side}_{u}/{k}": v for k, v in layer.items()}
  return out


def total_moe_losses(stats: dict, side_tokens: dict) -> tuple[jax.Array, jax.Array]:
  """(aux, z) summed over all MoE layers (0 for a dense model). A layer's z-loss, a mean over the real tokens it
  routed, counts by their share of `side_tokens` ({'encoder' | 'decoder': a whole batch's real tokens}), so that
  microbatches' z-losses add up to the whole batch's (the share is 1 without microbatches)."""
  zero = jnp.zeros((), jnp.float32)
  aux = sum((jnp.sum(s["aux_loss"]) for s in stats.values() if s), zero)
  z = sum((jnp.sum(s["z_loss"] * (s["metrics"]["real_tokens"] / side_tokens[side]))
           for side, s in stats.items() if s), zero)
  return aux, z


def merge_microbatches(stats: dict) -> dict:
  """MoE stats of K microbatches stacked on a leading axis -> the whole batch's: the aux loss a mean (every
  microbatch has as many groups), the z-loss a mean weighted by real tokens, the metrics `gating.merge_metrics`."""
  merged = {}
  for side, s in stats.items():
    if s:
      s = {"aux_loss": jnp.mean(s["aux_loss"], axis=0), "metrics": gating.merge_metrics(s["metrics"]),
           "z_loss": gating.weighted_mean(s["z_loss"], s["metrics"]["real_tokens"])}
    merged[side] = s
  return merged


def active_params(params, num_experts: int, experts_per_token: float) -> float:
  """Parameters a token uses: everything outside the experts, plus `experts_per_token` of the E experts of each
  MoE layer (the shared experts are outside: every token uses them)."""
  total = 0.0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = [getattr(k, "key", "") for k in path]
    is_expert = "moe" in names and names[-1] in ("wi", "wo")
    total += leaf.size * (experts_per_token / num_experts if is_expert else 1.0)
  return total


def step_flops(params, moe_cfg, source_tokens: float, target_tokens: float) -> float:
  """Model FLOPs of a training step, the usual 6N count (attention scores and embedding look-ups left out): 6 per
  active parameter of the encoder per source token, of the decoder and output projection per target token, each
  side's MoE layers with the experts its router runs a token through (`Router.active_experts`; the MoE section
  `moe_cfg`)."""
  logits = params["logits"] if "logits" in params else params["embed"]["embedding"]
  E = moe_cfg.num_experts
  experts = [routers.router_class(moe_cfg, decoder).active_experts(moe_cfg) for decoder in (False, True)]
  encoder = active_params(params["encoder"], E, experts[0])
  decoder = active_params(params["decoder"], E, experts[1]) + logits.size
  return 6 * (encoder * source_tokens + decoder * target_tokens)


def mfu(flops_per_second: float, device, num_devices: int) -> float | None:
  """Model FLOPs utilisation of `num_devices` devices like `device` against `chips`' peak; None for a device the
  table does not know (a CPU): no MFU rather than a wrong one."""
  peak = chips.peak_flops(device)
  return None if peak is None else flops_per_second / (peak * num_devices)


class EventLog:
  """A TensorBoard event file, written in the caller's thread: tensorboardX's background writer dies on a full disk
  and then blocks training on its full queue."""

  def __init__(self, directory: io.PathLike):
    directory = io.path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    self.path = directory / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
    self._write([event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")])

  def add(self, step: int, scalars: dict[str, float], histograms: dict | None = None):
    values = [summary.scalar(k, v) for k, v in scalars.items()]
    values += [summary.histogram(k, np.asarray(v), "auto") for k, v in (histograms or {}).items()]
    self._write([event_pb2.Event(wall_time=time.time(), step=int(step), summary=v) for v in values])

  def resume_at(self, step: int):
    """A restart marker: TensorBoard drops the earlier files' events from step + 1 on, which this run logs again."""
    start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
    self._write([event_pb2.Event(wall_time=time.time(), step=int(step) + 1, session_log=start)])

  def _write(self, events):
    records = []
    for event in events:
      data = event.SerializeToString()
      header = struct.pack("Q", len(data))
      records += [header, struct.pack("I", masked_crc32c(header)), data, struct.pack("I", masked_crc32c(data))]
    io.append(self.path, b"".join(records))


class Writer:
  """Appends one JSON object per logged step to workdir/metrics.jsonl (per-expert vectors to expert_load.jsonl)
  and mirrors them to TensorBoard. Disabled on processes other than 0."""

  def __init__(self, workdir: io.PathLike, enabled: bool = True):
    self.enabled = enabled
    self.path = io.path(workdir) / "metrics.jsonl"
    self.vectors_path = io.path(workdir) / "expert_load.jsonl"
    self.events = EventLog(io.path(workdir) / "tensorboard") if enabled else None

  def keep_until(self, step: int):
    """Drops the rows past `step`, which a run resumed at `step` logs again, and a last row cut short by a kill;
    each file is replaced atomically. TensorBoard's files are marked instead (`EventLog.resume_at`)."""
    if not self.enabled:
      return
    if step:
      self.events.resume_at(step)
    for path in (self.path, self.vectors_path):
      rows = io.read_jsonl(path)
      kept = [r for r in rows if r["step"] <= step]
      if len(kept) < len(rows) or io.ends_cut_short(path):
        io.write_atomically(path, "".join(json.dumps(r) + "\n" for r in kept))

  def write(self, step: int, values: dict):
    if not self.enabled:
      return
    row = {"step": int(step)} | {k: None if v is None or not math.isfinite(v) else float(v) for k, v in values.items()}
    io.append(self.path, json.dumps(row) + "\n")
    self.events.add(step, {k: v for k, v in row.items() if k != "step" and v is not None})

  def write_vectors(self, step: int, vectors: dict):
    """Appends {'step', name: [values]} to expert_load.jsonl; TensorBoard gets each as a histogram."""
    if not self.enabled or not vectors:
      return
    row = {"step": int(step)} | {k: [float(x) for x in v] for k, v in vectors.items()}
    io.append(self.vectors_path, json.dumps(row) + "\n")
    self.events.add(step, {}, vectors)

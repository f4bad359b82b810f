"""`auto`: the options whose best value differs by platform, and what `auto` means on each, resolved where the
devices are known (`resolved`); config.json keeps `auto`, so a work directory moves between platforms. Any of
them may be set by hand.

The choices, measured (docs/decisions.md, docs/performance.md):
- GPUs: the reference paths, with the index dispatch's gather backward (the MoE layer 0.60 of a dense FFN against
  0.56 with the scatter-add, and configs/base.py learned with it, on an H200, 2026-11-27, JAX 0.11.2). Not the
  faster options: with rbg dropout bits, cuDNN's flash attention and the bf16 residual stream together, base's step
  took 42.7 ms against 45.2, but neither base nor dense_base learned (loss 8.86 -> 8.87 and 9.00 -> 9.00 over 30
  steps, against 8.84 -> 7.39 with the reference paths), while the same options learn on a CPU
  (bench/results/h200-2026-11-27/). Which of the three fails on a GPU is not known yet.
- TPUs: XLA's own paths, no kernel that has never run on a TPU.
- CPUs: the reference paths, so that results stay bit-exact against earlier runs.
"""

from __future__ import annotations

AUTO = "auto"
REFERENCE = {"model.dropout_rng": "threefry", "model.attention": "xla", "model.residual_dtype": "float32",
             "moe.dispatch": "index"}
BY_PLATFORM = {
    "gpu": REFERENCE | {"moe.dispatch": "index_gather"},
    "tpu": REFERENCE,
    "cpu": REFERENCE,
}
PLATFORM_NAMES = {"cuda": "gpu", "rocm": "gpu"}  # jax.Device.platform spellings of the same kind


class WithAuto:
  """The allowed values of an option that may be `auto`: 'auto' and those of `allowed` (a tuple or a registry)."""

  def __init__(self, allowed):
    self.allowed = allowed

  def __contains__(self, value) -> bool:
    return value == AUTO or value in self.allowed

  def __iter__(self):
    return iter((AUTO, *self.allowed))


def dispatch_on(dispatch: str, platform: str) -> str:
  """moe.dispatch on `platform`: `auto` resolved, any other value as it is."""
  return chosen({"moe.dispatch": dispatch}, platform).get("moe.dispatch", dispatch)


def chosen(values: dict, platform: str) -> dict[str, str]:
  """{key: value} for each key of `values` (flat 'section.key' -> value) that is `auto`: its value on `platform`
  (an unknown platform gets the reference paths)."""
  table = BY_PLATFORM.get(PLATFORM_NAMES.get(platform, platform), REFERENCE)
  return {key: table[key] for key, value in values.items() if key in table and value == AUTO}

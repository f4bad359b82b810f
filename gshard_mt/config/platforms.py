"""`auto`: the options whose best value differs by platform, and what `auto` means on each, resolved where the
devices are known; config.json keeps `auto`, so a work directory moves between platforms.

The choices, measured (docs/decisions.md):
- GPUs: the reference paths with the index dispatch's gather backward (the MoE layer 0.60 of a dense FFN against
  0.56). rbg dropout bits, cuDNN attention and the bf16 residual together made base's step 42.7 ms against 45.2 on
  an H200, but then neither base nor dense_base learned (they do on a CPU); which of the three fails is not known
  (the suspect, cuDNN's backward on padding queries that saw no key, is fixed in `layers.fused_mask`, unmeasured).
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
  """'auto' and the values of `allowed` (a tuple or a registry)."""

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
  """{key: its value on `platform`} for each 'section.key' of `values` that is `auto` (an unknown platform: the
  reference paths)."""
  table = BY_PLATFORM.get(PLATFORM_NAMES.get(platform, platform), REFERENCE)
  return {key: table[key] for key, value in values.items() if key in table and value == AUTO}

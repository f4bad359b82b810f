"""`auto`: the options whose best value differs by platform, and what `auto` means on each, resolved where the
devices are known; config.json keeps `auto`, so a work directory moves between platforms.

The choices, measured (docs/decisions.md):
- GPUs: cuDNN attention, the bf16 residual stream and the index dispatch's gather backward. On an H200 these with
  rbg dropout bits made base's step 43.3 ms against 47.5-47.9 on the reference paths (1.10x), and it learned as the
  reference does (loss 8.84-8.85 -> 7.39 over 30 steps in both). rbg alone saved 0.1 ms (44.9 against 45.0) and,
  split over several devices, draws the whole batch's bits on each (bench/dropout_bits.py), so dropout stays
  threefry. cuDNN attention only for a bf16 model without attention dropout (cuDNN takes neither float32 nor
  dropout), the bf16 residual only for a bf16 model: otherwise those two keep the reference's value.
- TPUs: XLA's own paths, no kernel that has never run on a TPU.
- CPUs: the reference paths, so that results stay bit-exact against earlier runs.
"""

from __future__ import annotations

AUTO = "auto"
REFERENCE = {"model.dropout_rng": "threefry", "model.attention": "xla", "model.residual_dtype": "float32",
             "moe.dispatch": "index"}
BY_PLATFORM = {
    "gpu": REFERENCE | {"model.attention": "fused", "model.residual_dtype": "bfloat16", "moe.dispatch": "index_gather"},
    "tpu": REFERENCE,
    "cpu": REFERENCE,
}
# Where the platform's value does not apply, given the other settings: the reference's value is taken instead.
APPLIES = {
    "model.attention": lambda values: (values["model.dtype"] == "bfloat16"
                                       and not values["model.attention_dropout_rate"]),
    "model.residual_dtype": lambda values: values["model.dtype"] == "bfloat16",
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
  reference paths); `values` holds the settings that APPLIES reads for the keys it resolves."""
  table = BY_PLATFORM.get(PLATFORM_NAMES.get(platform, platform), REFERENCE)
  return {key: table[key] if APPLIES.get(key, lambda _: True)(values) else REFERENCE[key]
          for key, value in values.items() if key in table and value == AUTO}

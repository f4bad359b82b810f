"""`auto`: the options whose best value differs by platform, and what `auto` means on each, resolved where the
devices are known (`resolved`); config.json keeps `auto`, so a work directory moves between platforms. Any of
them may be set by hand.

The choices, measured (docs/decisions.md, docs/performance.md):
- GPUs: XLA's RngBitGenerator for the dropout bits, cuDNN's flash attention, the bf16 residual stream, and the
  index dispatch's gather backward. On an H200 (2026-11-26, JAX 0.11.2) dense_base's step went from 38.7 to 32.0 ms
  with the first three (and dropout 0), and the MoE layer from 0.58 to 0.62 of a dense FFN with the gathers; the
  bf16 residual kept Multi30k's test_2016_flickr de->en at 29.95 BLEU against 30.1.
- TPUs: XLA's own paths, no kernel that has never run on a TPU.
- CPUs: the reference paths, so that results stay bit-exact against earlier runs.
"""

from __future__ import annotations

AUTO = "auto"
REFERENCE = {"model.dropout_rng": "threefry", "model.attention": "xla", "model.residual_dtype": "float32",
             "moe.dispatch": "index"}
BY_PLATFORM = {
    "gpu": {"model.dropout_rng": "rbg", "model.attention": "fused", "model.residual_dtype": "bfloat16",
            "moe.dispatch": "index_gather"},
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
  if values.get("model.attention_dropout_rate"):  # only the einsums have attention dropout
    table = table | {"model.attention": REFERENCE["model.attention"]}
  return {key: table[key] for key, value in values.items() if key in table and value == AUTO}

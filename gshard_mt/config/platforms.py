"""`auto`: the options whose best value differs by platform, and what `auto` means on each, resolved where the
devices are known (`resolve`); config.json keeps `auto`, so a work directory moves between platforms. GPUs: cuDNN
attention, the bf16 residual stream and the index dispatch's gather backward, and threefry dropout bits (why, with
the numbers: docs/decisions.md); TPUs: XLA's own paths, no kernel that has never run on a TPU; CPUs: the reference
paths, bit-exact against earlier runs.
"""

from __future__ import annotations

import dataclasses

AUTO = "auto"
REFERENCE = {"model.dropout_rng": "threefry", "model.attention": "xla", "model.residual_dtype": "float32",
             "moe.dispatch": "index"}
# Where a platform's values differ from the reference's (any platform not named here: the reference).
BY_PLATFORM = {"gpu": REFERENCE | {"model.attention": "fused", "model.residual_dtype": "bfloat16",
                                   "moe.dispatch": "index_gather"}}
# Where the platform's value does not apply, given the other settings: the reference's value is taken instead.
APPLIES = {
  "model.attention": lambda values: values["model.dtype"] == "bfloat16" and not values["model.attention_dropout_rate"],
  "model.residual_dtype": lambda values: values["model.dtype"] == "bfloat16",
}
PLATFORM_NAMES = {"cuda": "gpu", "rocm": "gpu"}  # jax.Device.platform spellings of the same kind


def chosen(values: dict, platform: str) -> dict[str, str]:
  """{key: its value on `platform`} for each 'section.key' of `values` that is `auto` (an unknown platform: the
  reference paths); `values` holds the settings that APPLIES reads for the keys it resolves."""
  table = BY_PLATFORM.get(PLATFORM_NAMES.get(platform, platform), REFERENCE)
  return {key: table[key] if APPLIES.get(key, lambda _: True)(values) else REFERENCE[key]
          for key, value in values.items() if key in table and value == AUTO}


def resolve(config, platform: str):
  """(`config` (a `Config`) with every `auto` option replaced by its value on `platform`, {key: value} of those):
  the one place `auto` is resolved, where the devices are known."""
  values = {f"{section}.{f.name}": getattr(getattr(config, section), f.name)
            for section in ("model", "moe") for f in dataclasses.fields(getattr(config, section))}
  picked = chosen(values, platform)
  changes: dict[str, dict] = {}
  for key, value in picked.items():
    section, name = key.split(".")
    changes.setdefault(section, {})[name] = value
  return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **fields)
                                        for section, fields in changes.items()}), picked

"""Temperature sampling over languages (M4 / GShard): p_l proportional to n_l^(1/T)."""

from __future__ import annotations

import math

import numpy as np


def temperature_rates(counts: dict[str, int], temperature: float) -> dict[str, float]:
  """Sampling probability of each language: T=1 proportional to its size, T=inf uniform, T=5 the paper's (T > 0:
  the data section checks it)."""
  if not counts or any(n <= 0 for n in counts.values()):
    raise ValueError(f"every language needs at least one training pair, got {counts}")
  langs = sorted(counts)
  n = np.array([counts[lang] for lang in langs], np.float64)
  weights = np.ones_like(n) if math.isinf(temperature) else (n / n.sum()) ** (1.0 / temperature)
  return dict(zip(langs, (weights / weights.sum()).tolist()))

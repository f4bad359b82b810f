"""Temperature sampling rates."""

import math

import pytest

from gshard_mt.data import sampling


def test_temperature_rates():
  counts = {"a": 1000, "b": 100, "c": 10}
  assert sampling.temperature_rates(counts, 1.0) == pytest.approx({"a": 1000 / 1110, "b": 100 / 1110,
                                                                   "c": 10 / 1110})
  assert sampling.temperature_rates(counts, math.inf) == pytest.approx({k: 1 / 3 for k in counts})
  t5 = sampling.temperature_rates(counts, 5.0)
  w = {k: (v / 1110) ** 0.2 for k, v in counts.items()}
  assert t5 == pytest.approx({k: v / sum(w.values()) for k, v in w.items()})

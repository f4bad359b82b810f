"""What every config section checks, from tables of its keys (choices, positive and non-negative integers, float
ranges), and each field's type."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, ClassVar

from gshard_mt.config.errors import ConfigError, article


class Section:
  """A section's checks: CHOICES (key -> allowed values or a registry), POSITIVE (integers > 0), NONNEGATIVE
  (key -> what 0 means), RANGES (float key -> (test, the range in words)), and each field's annotated type.
  KEY: the section's name in the config."""

  KEY: ClassVar[str] = ""
  CHOICES: ClassVar[dict[str, Any]] = {}
  POSITIVE: ClassVar[tuple[str, ...]] = ()
  NONNEGATIVE: ClassVar[dict[str, str]] = {}
  RANGES: ClassVar[dict[str, tuple]] = {}

  def __post_init__(self):
    hints = typing.get_type_hints(type(self))
    for f in dataclasses.fields(self):
      if not is_a(value := getattr(self, f.name), kind := hints[f.name]):
        raise ConfigError(f"{self.key(f.name)}={value!r}: expected {article(kind.__name__)}, got "
                          f"{article(type(value).__name__)}")
      if kind is float:  # an int given for a float (config.json's 2, --config.key=2)
        object.__setattr__(self, f.name, float(value))
    self.check_values()

  def key(self, name: str) -> str:
    return f"{self.KEY}.{name}" if self.KEY else name

  def check_values(self):
    for name, allowed in self.CHOICES.items():
      if getattr(self, name) not in allowed:
        raise ConfigError(f"{self.key(name)}={getattr(self, name)!r}: expected one of {tuple(allowed)}")
    for name in self.POSITIVE:
      if getattr(self, name) <= 0:
        raise ConfigError(f"{self.key(name)}={getattr(self, name)!r}: expected a positive integer")
    for name, zero in self.NONNEGATIVE.items():
      if getattr(self, name) < 0:
        raise ConfigError(f"{self.key(name)}={getattr(self, name)!r}: expected an integer >= 0 ({zero})")
    for name, (test, expected) in self.RANGES.items():
      if not math.isfinite(value := getattr(self, name)) or not test(value):
        raise ConfigError(f"{self.key(name)}={value!r}: expected a finite number {expected}")


class Plus:
  """A CHOICES entry: `value` (platforms.AUTO, '' for "the default"), the values of `allowed` (a tuple or a
  registry), then the values `after` (a kernel option's, which the kernels' seam serves)."""

  def __init__(self, value, allowed, *after):
    self.value = value
    self.allowed = allowed
    self.after = after

  def __contains__(self, value) -> bool:
    return value == self.value or value in self.allowed or value in self.after

  def __iter__(self):
    return iter((self.value, *self.allowed, *self.after))


def is_a(value, kind) -> bool:
  """Whether `value` is of the config type `kind` (an int is a float; a bool is no int; other types pass)."""
  if kind not in (int, float, str, bool):
    return True
  if kind is float:
    return isinstance(value, int | float) and not isinstance(value, bool)
  return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def fraction(low_open: bool = False):
  return (lambda x: 0 < x <= 1, "in (0, 1]") if low_open else (lambda x: 0 <= x < 1, "in [0, 1)")

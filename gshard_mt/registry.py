"""Registries: the extension points (routers, data sources, schedules, ...) found by name, each one class in one
place. A registry lives beside the classes it holds (ROUTERS in moe/routers.py, SOURCES in data/sources.py, ...);
`training.validate` checks the config's names against them.

  ROUTERS = Registry("moe.router")

  @ROUTERS.register("gshard")
  class GShard: ...

  ROUTERS.get("gshard")  # the class; an unknown name: KeyError naming the choices
  ROUTERS.names()        # ('gshard', ...), in registration order
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class Registry:
  """Named entries (classes or functions) of one kind; `kind` names it in errors (e.g. 'moe.router')."""

  def __init__(self, kind: str):
    self.kind = kind
    self._entries: dict[str, Any] = {}

  def register(self, name: str) -> Callable[[Any], Any]:
    """A decorator adding its argument under `name`; a name taken twice is an error (unless by the same object
    again, as when a module is reloaded)."""
    if not isinstance(name, str) or not name:
      raise ValueError(f"{self.kind}: a registered name must be a non-empty string, got {name!r}")

    def add(entry):
      old = self._entries.get(name)
      if old is not None and getattr(old, "__qualname__", old) != getattr(entry, "__qualname__", entry):
        raise ValueError(f"{self.kind} {name!r} is registered already ({old!r})")
      self._entries[name] = entry
      return entry

    return add

  def add(self, entries: dict[str, Any]) -> Registry:
    """Registers a table of entries (classes, policies, key makers) by name; returns self."""
    for name, entry in entries.items():
      self.register(name)(entry)
    return self

  def unregister(self, name: str) -> None:  # for tests that register an entry of their own
    self._entries.pop(name, None)

  def get(self, name: str) -> Any:
    entries = self._entries
    if name not in entries:
      raise KeyError(f"{self.kind}={name!r}: expected one of {self.names()}")
    return entries[name]

  __getitem__ = get

  def names(self) -> tuple[str, ...]:
    return tuple(self._entries)

  def items(self) -> Iterator[tuple[str, Any]]:
    return iter(tuple(self._entries.items()))

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def __contains__(self, name: object) -> bool:
    return name in self._entries

  def __len__(self) -> int:
    return len(self._entries)

  def __repr__(self) -> str:
    return f"Registry({self.kind!r}, {list(self._entries)})"

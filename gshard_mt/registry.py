"""Registries: the extension points (routers, data sources, schedules) found by name, each one class in one place.

A module that defines an extension registers it with its registry's decorator; whoever reads a config asks the
registry for the allowed names and for the class. Plain Python, no JAX: the config layer imports it.

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
    """A decorator adding its argument under `name` and returning it unchanged; a name taken twice is an error
    (unless it is the same object again, as when a module is reloaded)."""
    if not isinstance(name, str) or not name:
      raise ValueError(f"{self.kind}: a registered name must be a non-empty string, got {name!r}")

    def add(entry):
      old = self._entries.get(name)
      if old is not None and getattr(old, "__qualname__", old) != getattr(entry, "__qualname__", entry):
        raise ValueError(f"{self.kind} {name!r} is registered already ({old!r})")
      self._entries[name] = entry
      return entry

    return add

  def unregister(self, name: str) -> None:
    """Removes `name` (tests that register an entry of their own take it out again)."""
    self._entries.pop(name, None)

  def get(self, name: str) -> Any:
    """The entry registered as `name`; KeyError naming the choices otherwise."""
    if name not in self._entries:
      raise KeyError(f"{self.kind}={name!r}: expected one of {self.names()}")
    return self._entries[name]

  def names(self) -> tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(self._entries)

  def items(self) -> Iterator[tuple[str, Any]]:
    return iter(tuple(self._entries.items()))

  def __contains__(self, name: object) -> bool:
    return name in self._entries

  def __len__(self) -> int:
    return len(self._entries)

  def __repr__(self) -> str:
    return f"Registry({self.kind!r}, {list(self._entries)})"

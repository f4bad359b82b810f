"""Registries: the extension points (routers, data sources, schedules) found by name, each one class in one place.

A module that defines an extension registers it with its registry's decorator; whoever reads a config asks the
registry for the allowed names and for the class. Plain Python, no JAX: the config layer imports it.

  ROUTERS = Registry("moe.router")

  @ROUTERS.register("gshard")
  class GShard: ...

  ROUTERS.get("gshard")  # the class; an unknown name: KeyError naming the choices
  ROUTERS.names()        # ('gshard', ...), in registration order

A registry may name the module that registers its built-in entries (`builtins`): it is imported the first time the
registry is read, by name (as big_vision finds its models), so that a module below it in the layers (the config)
can hold or read the registry without importing what the entries need (JAX). Entries registered anywhere else
count once their module is imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any


class Registry:
  """Named entries (classes or functions) of one kind; `kind` names it in errors (e.g. 'moe.router'); `builtins`
  the module (dotted name) whose import registers the built-in entries, imported when the registry is first read."""

  def __init__(self, kind: str, builtins: str | None = None):
    self.kind = kind
    self.builtins = builtins
    self._entries: dict[str, Any] = {}

  def _read(self) -> dict[str, Any]:
    """The entries, the built-in ones imported first."""
    if self.builtins:
      module, self.builtins = self.builtins, None  # once, even if the import reads the registry itself
      importlib.import_module(module)
    return self._entries

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

  def add(self, entries: dict[str, Any]) -> Registry:
    """Registers every (name, entry) of `entries` (a table of plain values: policies, key makers); returns self."""
    for name, entry in entries.items():
      self.register(name)(entry)
    return self

  def unregister(self, name: str) -> None:
    """Removes `name` (tests that register an entry of their own take it out again)."""
    self._entries.pop(name, None)

  def get(self, name: str) -> Any:
    """The entry registered as `name`; KeyError naming the choices otherwise."""
    entries = self._read()
    if name not in entries:
      raise KeyError(f"{self.kind}={name!r}: expected one of {self.names()}")
    return entries[name]

  def names(self) -> tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(self._read())

  def items(self) -> Iterator[tuple[str, Any]]:
    return iter(tuple(self._read().items()))

  def __getitem__(self, name: str) -> Any:
    return self.get(name)

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def __contains__(self, name: object) -> bool:
    return name in self._read()

  def __len__(self) -> int:
    return len(self._read())

  def __repr__(self) -> str:
    return f"Registry({self.kind!r}, {list(self._entries)})"

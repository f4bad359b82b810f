"""gshard_mt.registry: names to classes, one place per kind of extension."""

import sys

import pytest

from gshard_mt.registry import Registry


def test_register_get_names():
  reg = Registry("thing")

  @reg.register("a")
  class A:
    pass

  reg.register("b")(int)
  assert reg.get("a") is A and reg.get("b") is int
  assert reg.names() == ("a", "b") and "a" in reg and "c" not in reg and len(reg) == 2
  with pytest.raises(KeyError, match=r"thing='c': expected one of \('a', 'b'\)"):
    reg.get("c")
  reg.unregister("b")
  assert reg.names() == ("a",)


def test_a_name_taken_twice_is_an_error():
  reg = Registry("thing")
  reg.register("a")(int)
  reg.register("a")(int)  # the same entry again (a module reloaded): fine
  with pytest.raises(ValueError, match="registered already"):
    reg.register("a")(float)
  with pytest.raises(ValueError, match="non-empty string"):
    reg.register("")


def test_the_registry_imports_no_jax():
  import subprocess

  code = "import sys, gshard_mt.registry; assert 'jax' not in sys.modules, sorted(sys.modules)"
  subprocess.run([sys.executable, "-c", code], check=True)



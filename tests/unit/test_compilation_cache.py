"""Where the persistent compilation cache goes (the flag, then GSHARD_MT_COMPILATION_CACHE, then JAX's variable, then
the per-user default), how the flag is taken out of a command's arguments, and that the test session's own cache is
a temporary folder, never the user's."""

import os

import pytest

from gshard_mt import compilation_cache as cc


def test_default_is_per_user_under_xdg_cache_home_else_home():
  assert cc.default_folder({"XDG_CACHE_HOME": "/x/cache"}) == "/x/cache/gshard_mt/jax"
  assert cc.default_folder({}) == os.path.join(os.path.expanduser("~"), ".cache", "gshard_mt", "jax")
  assert cc.choose(None, {"XDG_CACHE_HOME": "/x/cache"}) == ("/x/cache/gshard_mt/jax", "default")


def test_the_flag_comes_first_then_ours_then_jaxs():
  environ = {cc.SWITCH: "/ours", cc.JAX_VARIABLE: "/jax", "XDG_CACHE_HOME": "/x"}
  assert cc.choose("/flag", environ) == ("/flag", cc.FLAG)
  assert cc.choose(None, environ) == ("/ours", cc.SWITCH)
  assert cc.choose(None, {cc.JAX_VARIABLE: "/jax"}) == ("/jax", cc.JAX_VARIABLE)
  assert cc.choose("", {cc.SWITCH: " ", "XDG_CACHE_HOME": "/x"}) == ("/x/gshard_mt/jax", "default")  # empty: unset


@pytest.mark.parametrize("word", ["off", "OFF", "0", "none", "false", "no"])
def test_off_turns_it_off_wherever_it_is_said(word):
  assert cc.choose(word, {cc.SWITCH: "/ours"}) == (None, cc.FLAG)
  assert cc.choose(None, {cc.SWITCH: word, cc.JAX_VARIABLE: "/jax"}) == (None, cc.SWITCH)


def test_local_folders_are_made_absolute_and_object_storage_kept(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  assert cc.choose("rel/cache", {})[0] == str(tmp_path / "rel" / "cache")
  assert cc.choose("~/c", {})[0] == os.path.join(os.path.expanduser("~"), "c")
  assert cc.choose("gs://bucket/jax", {})[0] == "gs://bucket/jax"


def test_take_flag_in_both_forms_and_leaves_the_rest_in_order():
  assert cc.take_flag(["--workdir", "w", "--compilation_cache", "/c", "--step", "3"]) == (
      ["--workdir", "w", "--step", "3"], "/c")
  assert cc.take_flag(["--compilation_cache=off", "--config", "x.py"]) == (["--config", "x.py"], "off")
  assert cc.take_flag(["--config", "x.py"]) == (["--config", "x.py"], None)
  # No value: left for the command's parser to refuse.
  assert cc.take_flag(["--config", "x.py", "--compilation_cache"]) == (["--config", "x.py", "--compilation_cache"],
                                                                       None)


def test_the_test_session_never_uses_the_users_cache():
  """conftest.py points both variables at a temporary folder, so no test (nor a process it starts) writes into
  ~/.cache/gshard_mt/jax."""
  from tests import conftest

  assert cc.choose(None)[0] == conftest.COMPILATION_CACHE != cc.default_folder()
  assert os.environ[cc.JAX_VARIABLE] == conftest.COMPILATION_CACHE

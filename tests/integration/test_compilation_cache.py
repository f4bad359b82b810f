"""A second process loads what the first compiled: two processes run the same small program through cli.run (as
every command does) with one cache folder; the first writes it, the second loads it and compiles nothing. The log
names the folder; `--compilation_cache off` writes nothing; the default folder is made private to the user."""

import json
import stat
import subprocess
import sys

import pytest

from gshard_mt import compilation_cache as cc
from tests.helpers import ROOT, fresh_env

pytestmark = pytest.mark.slow  # starts processes

# A program through cli.run that compiles one function and prints what the cache did.
PROGRAM = """
import json, sys
from gshard_mt import cli, compilation_cache

def main(argv):
  import jax, jax.numpy as jnp
  assert argv == ["--other", "kept"], argv  # the cache flag is taken out before main
  print(float(jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((64, 64))).sum()))
  print(json.dumps(compilation_cache.counts()))

cli.run(main, sys.argv[1:])
"""


def run(*args, **env):
  environ = fresh_env(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", **env)
  environ.pop(cc.JAX_VARIABLE)  # the session's folder: only this test's folders here
  proc = subprocess.run([sys.executable, "-c", PROGRAM, *args, "--other", "kept"], capture_output=True, text=True,
                        timeout=300, cwd=ROOT, env=environ)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def entries(folder):
  return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_a_second_process_loads_the_programs_the_first_compiled(tmp_path):
  folder = tmp_path / "cache"
  first, log = run("--compilation_cache", str(folder), GSHARD_MT_COMPILATION_CACHE="off")  # the flag wins
  written = entries(folder)
  assert first["written"] >= 1 and first["loaded"] == 0 and written, (first, written)
  assert f"compilation cache: {folder} (from --compilation_cache;" in log, log
  second, _ = run(GSHARD_MT_COMPILATION_CACHE=str(folder))
  assert second["loaded"] >= 1 and second["written"] == 0, second
  assert entries(folder) == written  # nothing compiled again, nothing new written


def test_off_writes_nothing(tmp_path):
  folder = tmp_path / "cache"
  counts, log = run("--compilation_cache=off", XDG_CACHE_HOME=str(tmp_path / "xdg"),
                    GSHARD_MT_COMPILATION_CACHE=str(folder))
  assert counts == {"loaded": 0, "written": 0}
  assert not folder.exists() and not (tmp_path / "xdg").exists()
  assert "compilation cache:" not in log


def test_the_default_folder_is_the_users_alone(tmp_path):
  environ = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
  counts, log = run(GSHARD_MT_COMPILATION_CACHE="", **environ)
  folder = tmp_path / "xdg" / "gshard_mt" / "jax"
  assert counts["written"] >= 1 and entries(folder)
  assert stat.S_IMODE(folder.stat().st_mode) == 0o700
  assert f"compilation cache: {folder} (the default;" in log, log

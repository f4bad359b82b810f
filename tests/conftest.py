"""Shared fixtures: a small config on a few shipped languages, and a tokenizer trained once per session."""

import os
import shutil
import tempfile

import pytest

# One compilation cache per test session (also inherited by subprocesses): tests that build the same small
# model share its compiled programs instead of compiling them again, and none writes to the user's own cache
# (~/.cache/gshard_mt/jax, which every command through cli.run uses; GSHARD_MT_COMPILATION_CACHE comes first).
# Removed when the session ends (it grows to ~90 MB, and every session makes a new one).
COMPILATION_CACHE = tempfile.mkdtemp(prefix="gshard_mt_jax_cache_")
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["GSHARD_MT_COMPILATION_CACHE"] = COMPILATION_CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
# The commands that programs suggest follow how they were started (`gshard_mt.hints`): the programs the tests start
# are started by python, whether `make test` or pytest started the tests.
os.environ.pop("MAKELEVEL", None)

from tests.helpers import small_config  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
  shutil.rmtree(COMPILATION_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
  from gshard_mt.data import pipeline

  workdir = tmp_path_factory.mktemp("tokenizer")
  pipeline.load(small_config(), workdir)
  return workdir / "tokenizer"


@pytest.fixture
def workdir(tmp_path, tokenizer_dir):
  """A fresh work directory that already holds the session's tokenizer and token caches."""
  run = tmp_path / "run"
  shutil.copytree(tokenizer_dir, run / "tokenizer")
  return run


@pytest.fixture(scope="session")
def data(tmp_path_factory, tokenizer_dir):
  """The small config's data (tokenizer, token arrays, rates), loaded once."""
  from gshard_mt.data import pipeline

  workdir = tmp_path_factory.mktemp("data")
  shutil.copytree(tokenizer_dir, workdir / "tokenizer")
  return pipeline.load(small_config(), workdir)

"""Shared fixtures: a small config on a few shipped languages, and a tokenizer trained once per session."""

import os
import pathlib
import shutil
import sys
import tempfile

import pytest

# One compilation cache per test session (also inherited by subprocesses): tests that build the same small
# model share its compiled programs instead of compiling them again.
os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="gshard_mt_jax_cache_")
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gshard_mt import config as config_lib  # noqa: E402

LANGUAGES = "fra,deu,spa,ell,kab"


def small_config(**overrides):
  """configs/tiny.py shrunk to compile and run in seconds on a CPU."""
  values = {"batch_size": "8", "num_train_steps": "6", "log_every": "1", "eval_every": "0", "eval_batches": "2",
            "checkpoint_every": "3", "data.languages": LANGUAGES, "data.vocab_size": "600", "data.max_length": "24",
            "model.emb_dim": "32", "model.num_heads": "2", "model.head_dim": "16", "model.mlp_dim": "64",
            "moe.num_experts": "4", "moe.hidden_dim": "64", "moe.group_size": "64", "data.prefetch": "1"}
  values.update({k: str(v) for k, v in overrides.items()})
  return config_lib.load(ROOT / "configs" / "tiny.py", values)


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

"""The XLA flags set on GPUs only: added where JAX will use a CUDA backend (the platform mocked), nothing on a CPU or
TPU, the user's own value of a flag wins, GSHARD_MT_GPU_FLAGS=0 turns them off, and XLA knows every flag."""

import logging
import os
import subprocess
import sys

import pytest

from gshard_mt import cli, gpu_flags

LISTED = [f"--{name}={value}" for name, value in gpu_flags.FLAGS]


@pytest.fixture
def cuda_plugin(monkeypatch):
  """A machine with JAX's CUDA plugin installed: a module that exists stands for it."""
  monkeypatch.setattr(gpu_flags, "CUDA_PLUGINS", ("json",))


@pytest.fixture
def no_cuda_plugin(monkeypatch):
  monkeypatch.setattr(gpu_flags, "CUDA_PLUGINS", ("gshard_mt_no_such_plugin",))


@pytest.mark.parametrize("platforms", ["", "cuda", "gpu", "cuda,cpu"])
def test_a_gpu_gets_the_flags(cuda_plugin, platforms, caplog):
  env = {"JAX_PLATFORMS": platforms, "XLA_FLAGS": "--xla_dump_to=/tmp/x"}
  with caplog.at_level(logging.INFO, logger=gpu_flags.__name__):
    assert gpu_flags.apply(env) == LISTED
  assert env["XLA_FLAGS"] == " ".join(["--xla_dump_to=/tmp/x", *LISTED])
  assert gpu_flags.apply(env) == [] and env["XLA_FLAGS"].count("latency_hiding") == 1  # once
  assert len(caplog.records) == 1 and "GSHARD_MT_GPU_FLAGS=0" in caplog.text


def test_add_keeps_the_users_value_and_adds_once():
  env = {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION"}
  assert gpu_flags.add((("xla_gpu_enable_command_buffer", ""), ("xla_dump_to", "/tmp/x")), env) == [
      "--xla_dump_to=/tmp/x"]
  assert env["XLA_FLAGS"] == "--xla_gpu_enable_command_buffer=FUSION --xla_dump_to=/tmp/x"
  env = {}
  assert gpu_flags.add((("xla_gpu_enable_command_buffer", ""),), env) == ["--xla_gpu_enable_command_buffer="]
  assert gpu_flags.add((("xla_gpu_enable_command_buffer", ""),), env) == []
  assert env == {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="}


@pytest.mark.parametrize("platforms", ["cpu", "tpu", "tpu,cpu"])
def test_cpu_and_tpu_are_left_alone(cuda_plugin, platforms):
  env = {"JAX_PLATFORMS": platforms}
  assert gpu_flags.apply(env) == [] and env == {"JAX_PLATFORMS": platforms}


def test_without_the_cuda_plugin_nothing_changes(no_cuda_plugin):
  env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
  assert gpu_flags.apply(env) == [] and env == {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}


def test_the_users_value_wins(cuda_plugin):
  env = {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=true --xla_gpu_enable_latency_hiding_scheduler"}
  added = gpu_flags.apply(env)
  assert added == ["--xla_gpu_enable_highest_priority_async_stream=true"]
  assert env["XLA_FLAGS"].split() == ["--xla_gpu_enable_triton_gemm=true",
                                      "--xla_gpu_enable_latency_hiding_scheduler", *added]


def test_switched_off(cuda_plugin):
  env = {"GSHARD_MT_GPU_FLAGS": "0"}
  assert gpu_flags.apply(env) == [] and "XLA_FLAGS" not in env


def test_every_entry_point_applies_them(cuda_plugin, monkeypatch):
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.delenv(gpu_flags.SWITCH, raising=False)
  monkeypatch.setenv("XLA_FLAGS", "")
  seen = []
  cli.run(lambda argv: seen.append(os.environ["XLA_FLAGS"]), [])
  assert seen == [" ".join(LISTED)]


def test_xla_knows_every_flag():
  """An unknown flag in XLA_FLAGS aborts the process: the installed jaxlib must parse all of them (the GPU flags
  are parsed on every backend)."""
  env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(LISTED), "PATH": ""}
  proc = subprocess.run([sys.executable, "-c", "import jax; print(jax.jit(lambda x: x + 1)(1))"], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and proc.stdout.strip() == "2", proc.stderr[-2000:]

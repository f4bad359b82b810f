"""The compiler flags of the entry points: added where JAX will use a CUDA backend (the platform mocked), nothing
on a CPU or TPU; the user's own value of a flag wins, a switch turns them off, XLA knows every flag. The TPU's
SparseCore option: libtpu knows it and offloads the MoE dispatch's gather with it, and only with it."""

import logging
import os
import subprocess
import sys

import pytest

from gshard_mt import cli, xla_flags

LISTED = [f"--{name}={value}" for name, value in xla_flags.GPU_FLAGS]


@pytest.fixture
def cuda_plugin(monkeypatch):
  """A machine with JAX's CUDA plugin installed: a module that exists stands for it."""
  monkeypatch.setattr(xla_flags, "CUDA_PLUGINS", ("json",))


@pytest.fixture
def no_cuda_plugin(monkeypatch):
  monkeypatch.setattr(xla_flags, "CUDA_PLUGINS", ("gshard_mt_no_such_plugin",))


@pytest.mark.parametrize("platforms", ["", "cuda", "gpu", "cuda,cpu"])
def test_a_gpu_gets_the_flags(cuda_plugin, platforms, caplog):
  env = {"JAX_PLATFORMS": platforms, "XLA_FLAGS": "--xla_dump_to=/tmp/x"}
  with caplog.at_level(logging.INFO, logger=xla_flags.__name__):
    assert xla_flags.apply(env) == LISTED
  assert env["XLA_FLAGS"] == " ".join(["--xla_dump_to=/tmp/x", *LISTED])
  assert xla_flags.apply(env) == [] and env["XLA_FLAGS"].count("latency_hiding") == 1  # once
  assert len(caplog.records) == 1 and "GSHARD_MT_GPU_FLAGS=0" in caplog.text


def test_add_keeps_the_users_value_and_adds_once():
  env = {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION"}
  assert xla_flags.add((("xla_gpu_enable_command_buffer", ""), ("xla_dump_to", "/tmp/x")), env) == [
      "--xla_dump_to=/tmp/x"]
  assert env["XLA_FLAGS"] == "--xla_gpu_enable_command_buffer=FUSION --xla_dump_to=/tmp/x"
  env = {}
  assert xla_flags.add((("xla_gpu_enable_command_buffer", ""),), env) == ["--xla_gpu_enable_command_buffer="]
  assert xla_flags.add((("xla_gpu_enable_command_buffer", ""),), env) == []
  assert env == {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="}


@pytest.mark.parametrize("platforms", ["cpu", "tpu", "tpu,cpu"])
def test_cpu_and_tpu_are_left_alone(cuda_plugin, platforms):
  env = {"JAX_PLATFORMS": platforms}
  assert xla_flags.apply(env) == [] and env == {"JAX_PLATFORMS": platforms}


def test_without_the_cuda_plugin_nothing_changes(no_cuda_plugin):
  env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
  assert xla_flags.apply(env) == [] and env == {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}


def test_the_users_value_wins(cuda_plugin):
  env = {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=true --xla_gpu_enable_latency_hiding_scheduler"}
  added = xla_flags.apply(env)
  assert added == ["--xla_gpu_enable_highest_priority_async_stream=true"]
  assert env["XLA_FLAGS"].split() == ["--xla_gpu_enable_triton_gemm=true",
                                      "--xla_gpu_enable_latency_hiding_scheduler", *added]


def test_switched_off(cuda_plugin):
  env = {"GSHARD_MT_GPU_FLAGS": "0"}
  assert xla_flags.apply(env) == [] and "XLA_FLAGS" not in env


def test_every_entry_point_applies_them(cuda_plugin, monkeypatch):
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.delenv(xla_flags.GPU_SWITCH, raising=False)
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


def test_a_tpu_host_keeps_libtpus_defaults(monkeypatch):
  """On a TPU VM (its chips mocked) an entry point sets no libtpu flag: the SparseCore option is the user's."""
  from jax._src import hardware_utils

  monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id", lambda: (4, None))
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
  seen = []
  cli.run(lambda argv: seen.append(os.environ.get("LIBTPU_INIT_ARGS")), [])
  assert seen == [None]


def tpu_chips_here() -> int:
  from jax._src import hardware_utils

  return hardware_utils.num_available_tpu_chips_and_device_id()[0]


@pytest.mark.skipif(tpu_chips_here() > 0, reason="a TPU host: libtpu is its runtime")
def test_a_command_on_a_machine_without_tpu_says_nothing_about_libtpu(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "LIBTPU_INIT_ARGS"}
  from tests.helpers import ROOT

  proc = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny.py", "--workdir", str(tmp_path / "x"),
                         "--config.num_train_steps=0"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 2 and "num_train_steps=0" in proc.stderr, proc.stderr[-2000:]
  assert "libtpu" not in proc.stderr and "LIBTPU_INIT_ARGS" not in proc.stderr, proc.stderr[-2000:]


def test_the_sparsecore_option_offloads_the_dispatch_gather_and_only_it_does():
  """An unknown flag in LIBTPU_INIT_ARGS aborts the process. With the option, a v5p chip's dispatch gather (20,480
  rows from 8,192 tokens, configs/base.py's encoder) goes to the SparseCores and the estimate falls; with libtpu's
  defaults, what every command compiles, it stays a TensorCore fusion."""
  if sys.platform != "linux":
    pytest.skip("libtpu (the TPU compiler) has wheels for Linux only")
  import libtpu  # noqa: F401 - .[test] installs it on Linux: a missing or broken one fails, never skips

  program = """
import jax, jax.numpy as jnp
from gshard_mt.tpu.estimates import tpu_compiler as tpu
device, sharding = tpu.one_chip("v5p:1x1x1")
x = jax.ShapeDtypeStruct((8192, 512), jnp.bfloat16, sharding=sharding)
index = jax.ShapeDtypeStruct((20480,), jnp.int32, sharding=sharding)
compiled = jax.jit(lambda x, i: x[i]).lower(x, index).compile()
print("gather_offload" in compiled.as_text(), tpu.compiler_cost(compiled)["optimal_seconds"])
"""

  def run(flags):
    env = {**os.environ, "LIBTPU_INIT_ARGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    offloaded, seconds = proc.stdout.split()
    return offloaded == "True", float(seconds)

  (plain, plain_seconds), (flagged, flagged_seconds) = run([]), run([xla_flags.SPARSECORE_GATHERS])
  assert not plain and flagged and flagged_seconds < plain_seconds / 2

"""The compiler flags of the entry points. GPU: added where JAX will use a CUDA backend (the platform mocked),
nothing on a CPU or TPU. TPU: added where a TPU will run the program (libtpu installed and TPU chips, both mocked, or
compile-only TPU devices), nothing on a CPU machine that has libtpu for the TPU compiler; libtpu knows them and
offloads the MoE dispatch's gather with them. Both: the user's own value of a flag wins, a switch turns them off,
XLA knows every flag."""

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
    assert xla_flags.apply_gpu(env) == LISTED
  assert env["XLA_FLAGS"] == " ".join(["--xla_dump_to=/tmp/x", *LISTED])
  assert xla_flags.apply_gpu(env) == [] and env["XLA_FLAGS"].count("latency_hiding") == 1  # once
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
  assert xla_flags.apply_gpu(env) == [] and env == {"JAX_PLATFORMS": platforms}


def test_without_the_cuda_plugin_nothing_changes(no_cuda_plugin):
  env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
  assert xla_flags.apply_gpu(env) == [] and env == {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}


def test_the_users_value_wins(cuda_plugin):
  env = {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=true --xla_gpu_enable_latency_hiding_scheduler"}
  added = xla_flags.apply_gpu(env)
  assert added == ["--xla_gpu_enable_highest_priority_async_stream=true"]
  assert env["XLA_FLAGS"].split() == ["--xla_gpu_enable_triton_gemm=true",
                                      "--xla_gpu_enable_latency_hiding_scheduler", *added]


def test_switched_off(cuda_plugin):
  env = {"GSHARD_MT_GPU_FLAGS": "0"}
  assert xla_flags.apply_gpu(env) == [] and "XLA_FLAGS" not in env


def test_every_entry_point_applies_them(cuda_plugin, monkeypatch):
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.delenv(xla_flags.GPU_SWITCH, raising=False)
  monkeypatch.setenv(xla_flags.TPU_SWITCH, "0")
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


TPU_LISTED = [f"--{name}={value}" for name, value in xla_flags.TPU_FLAGS]


@pytest.fixture
def tpu_chips(monkeypatch):
  """Sets how many TPU chips JAX finds on this host's PCI bus (4 unless a test says otherwise)."""
  from jax._src import hardware_utils

  def attach(count: int):
    monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id", lambda: (count, None))

  attach(4)
  return attach


@pytest.fixture
def libtpu_installed(monkeypatch, tmp_path, tpu_chips):
  """A TPU host: its chips (`tpu_chips`), and a libtpu package whose library names `names`: a module `fake_libtpu`
  with a fake_libtpu.so beside it."""
  def install(names=tuple(name for name, _ in xla_flags.TPU_FLAGS)):
    package = tmp_path / "fake_libtpu"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "fake_libtpu.so").write_bytes(b"\x7fELF..." + b"\0".join(n.encode() for n in names) + b"\0...")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(xla_flags, "TPU_LIBRARY", "fake_libtpu")

  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  install()
  return install


def test_where_libtpu_is_installed_it_gets_the_tpu_flags_once(libtpu_installed, caplog):
  env = {"LIBTPU_INIT_ARGS": "--xla_tpu_enable_latency_hiding_scheduler=true"}
  with caplog.at_level(logging.INFO, logger=xla_flags.__name__):
    assert xla_flags.apply_tpu(env) == TPU_LISTED
  assert env["LIBTPU_INIT_ARGS"].split() == ["--xla_tpu_enable_latency_hiding_scheduler=true", *TPU_LISTED]
  assert xla_flags.apply_tpu(env) == [] and "XLA_FLAGS" not in env
  assert len(caplog.records) == 1 and "GSHARD_MT_TPU_FLAGS=0" in caplog.text


def test_the_tpu_flags_keep_the_users_value_and_their_switch(libtpu_installed, monkeypatch):
  name = xla_flags.TPU_FLAGS[0][0]
  env = {"LIBTPU_INIT_ARGS": f"--{name}=false"}
  assert xla_flags.apply_tpu(env) == [] and env == {"LIBTPU_INIT_ARGS": f"--{name}=false"}
  env = {"GSHARD_MT_TPU_FLAGS": "0"}
  assert xla_flags.apply_tpu(env) == [] and "LIBTPU_INIT_ARGS" not in env
  monkeypatch.setattr(xla_flags, "TPU_LIBRARY", "gshard_mt_no_such_library")
  assert xla_flags.apply_tpu({}) == []


@pytest.mark.parametrize("platforms", ["cpu", "cuda", "cpu,cuda"])
def test_a_tpu_host_told_to_use_another_platform_gets_no_tpu_flags(libtpu_installed, platforms):
  env = {"JAX_PLATFORMS": platforms}
  assert xla_flags.apply_tpu(env) == [] and env == {"JAX_PLATFORMS": platforms}
  env = {"JAX_PLATFORMS": "tpu,cpu"}
  assert xla_flags.apply_tpu(env) == TPU_LISTED


def test_libtpu_on_a_cpu_machine_gets_no_tpu_flags_and_logs_nothing(libtpu_installed, tpu_chips, caplog):
  tpu_chips(0)
  env = {}
  with caplog.at_level(logging.INFO, logger=xla_flags.__name__):
    assert xla_flags.apply_tpu(env) == [] and xla_flags.apply(env) == [] and env == {}
  assert caplog.text == ""
  # Compile-only TPU devices (the dry run, the benchmarks) compile with them all the same.
  assert xla_flags.apply_tpu(env, compile_only=True) == TPU_LISTED and env == {"LIBTPU_INIT_ARGS": " ".join(TPU_LISTED)}


def tpu_chips_here() -> int:
  from jax._src import hardware_utils

  return hardware_utils.num_available_tpu_chips_and_device_id()[0]


@pytest.mark.skipif(tpu_chips_here() > 0, reason="a TPU host: it gets the libtpu flags")
def test_a_command_on_a_machine_without_tpu_says_nothing_about_libtpu(tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in (xla_flags.TPU_SWITCH, "LIBTPU_INIT_ARGS")}
  from tests.helpers import ROOT

  proc = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny.py", "--workdir", str(tmp_path / "x"),
                         "--config.num_train_steps=0"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 2 and "num_train_steps=0" in proc.stderr, proc.stderr[-2000:]
  assert "libtpu" not in proc.stderr and "LIBTPU_INIT_ARGS" not in proc.stderr, proc.stderr[-2000:]


def test_compile_only_tpu_devices_get_the_flags(tmp_path):
  """The dry run and the benchmarks ask for compile-only TPU devices: their estimates compile with the flags."""
  if sys.platform != "linux":
    pytest.skip("libtpu (the TPU compiler) has wheels for Linux only")
  program = ("import os\nfrom gshard_mt.tpu.estimates import tpu_compiler as tpu\n"
             "print(len(tpu.topology_devices('v5p:1x1x1')), os.environ.get('LIBTPU_INIT_ARGS'))")
  env = {k: v for k, v in os.environ.items() if k not in (xla_flags.TPU_SWITCH, "LIBTPU_INIT_ARGS")}
  proc = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split() == ["1", *TPU_LISTED]


def test_a_flag_that_the_installed_libtpu_does_not_name_is_left_out(libtpu_installed, caplog):
  libtpu_installed(names=("xla_tpu_some_other_flag",))
  env = {}
  with caplog.at_level(logging.WARNING, logger=xla_flags.__name__):
    assert xla_flags.apply_tpu(env) == [] and env == {}
  assert "does not know --" + xla_flags.TPU_FLAGS[0][0] in caplog.text


def test_libtpu_knows_the_flags_and_offloads_the_dispatch_gather():
  """An unknown flag in LIBTPU_INIT_ARGS aborts the process. With the flags, a v5p chip's dispatch gather (20,480
  rows from 8,192 tokens, configs/base.py's encoder) goes to the SparseCores, and the estimate falls."""
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

  import importlib.util

  names = [name for name, _ in xla_flags.TPU_FLAGS]
  assert xla_flags.known_flags(names, importlib.util.find_spec("libtpu")) == set(names)

  def run(flags):
    env = {**os.environ, "LIBTPU_INIT_ARGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    offloaded, seconds = proc.stdout.split()
    return offloaded == "True", float(seconds)

  (plain, plain_seconds), (flagged, flagged_seconds) = run([]), run(TPU_LISTED)
  assert not plain and flagged and flagged_seconds < plain_seconds / 2

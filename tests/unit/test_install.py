"""The install step: tools/jax_build.py on faked machines (a root directory for /dev, /sys and /proc, and a PATH),
and the Makefile's use of it with a stub venv whose pip only records what it was asked to install."""

import importlib.metadata
import importlib.util
import os
import shutil
import stat
import subprocess
import sys

import pytest

from tests.helpers import ROOT

SCRIPT = ROOT / "tools" / "jax_build.py"
spec = importlib.util.spec_from_file_location("jax_build", SCRIPT)
jax_build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(jax_build)

OPEN_MODULE = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)\n"
PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"


def write(path, text=""):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  return path


def executable(path, script):
  write(path, "#!/bin/sh\n" + script)
  path.chmod(path.stat().st_mode | stat.S_IXUSR)


def pci(root, address, vendor, device):
  write(root / "sys/bus/pci/devices" / address / "vendor", vendor + "\n")
  write(root / "sys/bus/pci/devices" / address / "device", device + "\n")


@pytest.fixture
def machine(tmp_path):
  """An empty machine: (root, an empty PATH directory); the tests add devices and programs."""
  (tmp_path / "bin").mkdir()
  pci(tmp_path, "0000:00:01.0", "0x8086", "0x7113")  # an Intel bridge, as every VM has
  return tmp_path, tmp_path / "bin"


def detect(machine):
  root, path = machine
  return jax_build.detect(root, str(path))


def test_no_accelerator_is_cpu(machine):
  assert detect(machine) == ("cpu", "no TPU or NVIDIA GPU found")


@pytest.mark.parametrize("device, build", [("0x0062", "tpu"), ("0x006f", "tpu"), ("0x0027", "tpu"),
                                           ("0x0042", "cpu")])  # 0x0042: Google's gVNIC network card, no TPU
def test_google_pci_devices(machine, device, build):
  pci(machine[0], "0000:00:04.0", "0x1ae0", device)
  assert detect(machine)[0] == build


def test_tpu_device_files(machine):
  write(machine[0] / "dev/accel/accel0")  # the kernel's compute-accelerator class (an NPU, say): not a TPU
  assert detect(machine)[0] == "cpu"
  write(machine[0] / "dev/accel0")
  write(machine[0] / "dev/accel1")
  assert detect(machine) == ("tpu", "TPU device files /dev/accel0, /dev/accel1")


@pytest.mark.parametrize("version, build", [(OPEN_MODULE, "cuda13"), (PROPRIETARY, "cuda12")])
def test_nvidia_driver_version_from_proc(machine, version, build):
  write(machine[0] / "dev/nvidia0")
  write(machine[0] / "proc/driver/nvidia/version", version)
  build_found, why = detect(machine)
  assert build_found == build and why.startswith("NVIDIA GPU (/dev/nvidia0), driver 5")


@pytest.mark.parametrize("output, build", [("580.95.05", "cuda13"), ("575.57.08\n575.57.08", "cuda12"),
                                           ("999.1", "cuda13")])
def test_nvidia_driver_version_from_nvidia_smi(machine, output, build):
  executable(machine[1] / "nvidia-smi", f'[ "$1" = --query-gpu=driver_version ] && printf "{output}\\n"\n')
  assert detect(machine) == (build, f"NVIDIA GPU (nvidia-smi), driver {output.split()[0]}")


def test_nvidia_smi_without_a_gpu_is_cpu(machine):
  executable(machine[1] / "nvidia-smi", 'echo "No devices were found"; exit 6\n')
  assert detect(machine)[0] == "cpu"


def test_nvidia_device_with_unknown_driver_is_cuda12(machine):
  write(machine[0] / "dev/nvidiactl")
  assert detect(machine) == ("cuda12", "NVIDIA GPU (/dev/nvidiactl), driver version unknown")


def test_tpu_before_gpu(machine):
  pci(machine[0], "0000:00:05.0", "0x1ae0", "0x0063")
  write(machine[0] / "dev/nvidia0")
  assert detect(machine)[0] == "tpu"


def run_script(machine, *args):
  root, path = machine
  return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), *args], capture_output=True, text=True,
                        env={**os.environ, "PATH": str(path)})


def test_script_prints_the_build_and_why(machine):
  pci(machine[0], "0000:00:04.0", "0x1ae0", "0x005e")
  out = run_script(machine)
  assert (out.returncode, out.stdout) == (0, "tpu\n")
  assert out.stderr == ("JAX build: tpu: TPU PCI device 0000:00:04.0 (0x1ae0:0x005e); JAX_BUILD=cpu|tpu|cuda12|cuda13 "
                        "chooses another\n")
  assert run_script(machine, "--build", "cpu").stdout == "cpu\n"  # the user's choice wins


def test_script_refuses_an_unknown_build(machine):
  out = run_script(machine, "--build", "gpu")
  assert out.returncode == 2 and out.stdout == ""
  assert out.stderr == "error: JAX_BUILD='gpu': expected auto, cpu, tpu, cuda12, cuda13\n"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_makefile_installs_the_chosen_build(tmp_path):
  """`make venv` with a stub venv: its python runs everything but pip, whose arguments go to a log."""
  venv, log = tmp_path / "venv", tmp_path / "pip.log"
  executable(venv / "bin/python", f'if [ "$1" = -m ] && [ "$2" = pip ]; then shift 2; echo "$@" >> {log}; exit 0; fi\n'
                                  f'exec {sys.executable} "$@"\n')

  def make(*args):
    log.unlink(missing_ok=True)
    out = subprocess.run(["make", "-s", "-C", str(ROOT), f"VENV={venv}", f"PYTHON_FOR_VENV={sys.executable}", "venv",
                          *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return log.read_text().splitlines() if log.exists() else [], (venv / ".installed").read_text()

  base = ["install -q --upgrade pip", "install -q -e .[test]"]
  assert make("JAX_BUILD=cpu") == (base, "cpu\n")
  assert make("JAX_BUILD=cpu") == ([], "cpu\n")  # installed already
  jax_version = importlib.metadata.version("jax")
  assert make("JAX_BUILD=cuda13") == (base + [f"install -q jax[cuda13]=={jax_version}"], "cuda13\n")
  assert make() == ([], "cuda13\n")  # auto: the venv's build stays until pyproject.toml changes
  tpu = [base[0], "install -q -e .[test,gcs]"]  # a TPU VM's work directories may be in gs:// buckets
  assert make("JAX_BUILD=tpu") == (tpu + [f"install -q jax[tpu]=={jax_version}"], "tpu\n")

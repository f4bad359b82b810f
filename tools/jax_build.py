"""Which JAX build this machine needs: `tpu` (a Cloud TPU VM), `cuda13` or `cuda12` (NVIDIA GPUs), else `cpu`.

  python tools/jax_build.py [--build auto|cpu|tpu|cuda12|cuda13] [--root /]

Prints the build on stdout and why on stderr; `make venv` installs `jax[<build>]` at the installed jax's version
unless it is `cpu`. It reads only local signals, so it needs no network and no JAX (it runs before the venv exists):

- TPU: a PCI device of Google's (vendor 0x1ae0) with a TPU device id under /sys/bus/pci/devices (how JAX finds TPU
  chips; plain Google devices such as the gVNIC network card have other ids), or a /dev/accel<N> device file (the TPU
  driver's, on v2-v4 TPU VMs).
- NVIDIA: /dev/nvidia0 or /dev/nvidiactl, or an `nvidia-smi` on PATH that lists a GPU. The driver version (from
  /proc/driver/nvidia/version, else nvidia-smi) picks the CUDA build: JAX's CUDA 13 wheels need driver 580 or newer,
  so an older or unknown driver gets `cuda12`.

`--root` puts /dev, /sys and /proc under another directory and PATH decides which `nvidia-smi` runs, so the tests
fake a machine. `--build` other than `auto` is the user's choice (`make train JAX_BUILD=cpu`) and is printed as is.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import subprocess
import sys

BUILDS = ("cpu", "tpu", "cuda12", "cuda13")
GOOGLE_PCI_VENDOR = "0x1ae0"
# TPU chips' PCI device ids, as jax/_src/hardware_utils.py lists them (jax 0.12): v3, v4, v5p, v5e, v6e, TPU7x and
# three without public names.
TPU_PCI_DEVICES = {"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076", "0x007c", "0x0083"}
CUDA13_MIN_DRIVER = 580


def find_tpu(root: pathlib.Path) -> str | None:
  """Why this machine has a TPU, or None."""
  for vendor in sorted(root.glob("sys/bus/pci/devices/*/vendor")):
    device = vendor.with_name("device")
    if vendor.read_text().strip() == GOOGLE_PCI_VENDOR and device.is_file() and (
        device.read_text().strip() in TPU_PCI_DEVICES):
      return f"TPU PCI device {vendor.parent.name} ({GOOGLE_PCI_VENDOR}:{device.read_text().strip()})"
  accel = sorted(p.name for p in root.glob("dev/accel*") if re.fullmatch(r"accel\d+", p.name))
  return f"TPU device files /dev/{', /dev/'.join(accel)}" if accel else None


def nvidia_smi_driver(path: str | None) -> str | None:
  """The driver version nvidia-smi reports for the first GPU, or None without a working nvidia-smi or a GPU."""
  exe = shutil.which("nvidia-smi", path=path)
  if exe is None:
    return None
  try:
    out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return None
  lines = out.stdout.split()
  return lines[0] if out.returncode == 0 and lines else None


def find_nvidia(root: pathlib.Path, path: str | None) -> tuple[str, str] | None:
  """(build, why) for a machine with NVIDIA GPUs, or None."""
  devices = [f"/dev/{name}" for name in ("nvidia0", "nvidiactl") if (root / "dev" / name).exists()]
  proc = root / "proc/driver/nvidia/version"
  # "NVRM version: NVIDIA UNIX [Open] Kernel Module [for] x86_64  580.95.05  Release Build ..."
  found = re.search(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s", proc.read_text()) if proc.is_file() else None
  driver = found.group(1) if found else nvidia_smi_driver(path)
  if not devices and driver is None:
    return None
  where = ", ".join(devices) or "nvidia-smi"
  if driver is None:
    return "cuda12", f"NVIDIA GPU ({where}), driver version unknown"
  build = "cuda13" if int(driver.split(".")[0]) >= CUDA13_MIN_DRIVER else "cuda12"
  return build, f"NVIDIA GPU ({where}), driver {driver}"


def detect(root: pathlib.Path, path: str | None) -> tuple[str, str]:
  """(build, why) for the machine whose /dev, /sys and /proc are under `root` and whose programs are on `path`."""
  tpu = find_tpu(root)
  if tpu:
    return "tpu", tpu
  return find_nvidia(root, path) or ("cpu", "no TPU or NVIDIA GPU found")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--build", default="auto", help="auto (detect), or one of " + ", ".join(BUILDS))
  parser.add_argument("--root", default="/", help="the directory holding dev/, sys/ and proc/")
  args = parser.parse_args(argv)
  if args.build not in ("auto", *BUILDS):
    print(f"error: JAX_BUILD={args.build!r}: expected auto, {', '.join(BUILDS)}", file=sys.stderr)
    return 2
  build, why = detect(pathlib.Path(args.root), None) if args.build == "auto" else (args.build, "chosen (JAX_BUILD)")
  print(build)
  print(f"JAX build: {build}: {why}; JAX_BUILD=cpu|tpu|cuda12|cuda13 chooses another", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())

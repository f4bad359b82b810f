"""The compiler flags every entry point sets before JAX starts a backend (`cli.run`): XLA_FLAGS where JAX will use
an NVIDIA GPU, LIBTPU_INIT_ARGS where a TPU will run the program (or the compile-only TPU devices of the estimates);
a CPU gets neither. An unknown flag aborts the process: the GPU flags are tested against jaxlib, and a libtpu flag
is added only where the installed (unpinned) libtpu names it. A flag already set keeps the user's value;
GSHARD_MT_GPU_FLAGS=0 and GSHARD_MT_TPU_FLAGS=0 set none.

GPU: what MaxText's GPU scripts and NVIDIA's JAX-Toolbox recommend. Command buffers keep XLA's default, which
already captures fusions and library calls (`--xla_gpu_graph_level` and `--xla_gpu_experimental_triton_ragged_dot`
no longer exist in jaxlib 0.12); the collectives' combine thresholds tune many-GPU FSDP runs: the user's to set.

TPU: every gather the SparseCores can do goes to them (v5p, v6e; other chips ignore the flag). XLA otherwise offloads
only gathers from tables of 16 MiB or more: the MoE dispatch of configs/base.py (20,480 rows of 1 KiB from 8 MiB per
v5p chip) is estimated at 95 us as a TensorCore fusion and 25 us offloaded (docs/decisions.md).
"""

from __future__ import annotations

import importlib.util
import logging
import mmap
import os

from jax._src import hardware_utils

# What `quiet_tpu_host_lookup` names where no TPU chip is present: a local host and any accelerator type.
TPU_HOST_VARIABLES = {"TPU_WORKER_HOSTNAMES": "localhost", "TPU_ACCELERATOR_TYPE": "v3-8"}

log = logging.getLogger(__name__)

GPU_SWITCH, TPU_SWITCH = "GSHARD_MT_GPU_FLAGS", "GSHARD_MT_TPU_FLAGS"
# (flag, value): why.
GPU_FLAGS = (
    ("xla_gpu_enable_latency_hiding_scheduler", "true"),  # overlaps collectives with compute (JAX-Toolbox's image)
    ("xla_gpu_enable_triton_gemm", "false"),  # cuBLAS for the matmuls rather than Triton's
    ("xla_gpu_enable_highest_priority_async_stream", "true"),  # collectives' stream first, so compute waits less
)
TPU_FLAGS = (
    ("xla_tpu_offload_all_supported_gathers_to_sparsecore", "true"),  # the MoE layer's gathers (see above)
)
# JAX's CUDA plugins (`jax[cuda12]`, `jax[cuda13]`); without one JAX has no GPU backend.
CUDA_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin")
GPU_PLATFORMS = {"cuda", "gpu"}
TPU_LIBRARY = "libtpu"  # the TPU compiler and runtime, the only reader of LIBTPU_INIT_ARGS


def _allows(platforms: str, names) -> bool:
  """Whether JAX_PLATFORMS (`platforms`, comma-separated) is empty or names one of `names`."""
  named = {p.strip() for p in platforms.split(",") if p.strip()}
  return not named or bool(named & set(names))


def will_use_gpu(platforms: str) -> bool:
  """Whether JAX will start its CUDA backend, judged without starting it: JAX_PLATFORMS allows the GPU and a CUDA
  plugin is installed (without a GPU, JAX stays on the CPU, where the flags change nothing)."""
  return _allows(platforms, GPU_PLATFORMS) and any(importlib.util.find_spec(m) is not None for m in CUDA_PLUGINS)


def add(flags, environ=os.environ, variable: str = "XLA_FLAGS") -> list[str]:
  """Adds each (name, value) of `flags` that environ[variable] does not name already (the user's value wins);
  returns the flags added."""
  value = environ.get(variable, "")
  named = {word.lstrip("-").split("=", 1)[0] for word in value.split()}
  added = [f"--{name}={setting}" for name, setting in flags if name not in named]
  environ[variable] = " ".join([value.strip(), *added]).strip()
  return added


def apply_gpu(environ=os.environ) -> list[str]:
  """Adds GPU_FLAGS to environ['XLA_FLAGS'] when JAX will use a GPU (unless GSHARD_MT_GPU_FLAGS=0); returns them."""
  if environ.get(GPU_SWITCH, "1") == "0" or not will_use_gpu(environ.get("JAX_PLATFORMS", "")):
    return []
  return _logged(add(GPU_FLAGS, environ), "GPU XLA flags", GPU_SWITCH)


def will_use_tpu(platforms: str) -> bool:
  """Whether JAX will run the program on a TPU: JAX_PLATFORMS allows it and this host has TPU chips (JAX's count,
  from the PCI devices; libtpu installed for its compiler is no TPU)."""
  return _allows(platforms, ("tpu",)) and hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0


def apply_tpu(environ=os.environ, *, compile_only: bool = False) -> list[str]:
  """Adds the TPU_FLAGS that the installed libtpu knows to environ['LIBTPU_INIT_ARGS'] when a TPU will run the
  program or, with `compile_only`, for compile-only TPU devices (unless GSHARD_MT_TPU_FLAGS=0); returns them."""
  if environ.get(TPU_SWITCH, "1") == "0" or (spec := importlib.util.find_spec(TPU_LIBRARY)) is None:
    return []
  if not compile_only and not will_use_tpu(environ.get("JAX_PLATFORMS", "")):
    return []
  known = known_flags([name for name, _ in TPU_FLAGS], spec)
  for name, _ in TPU_FLAGS:
    if name not in known:
      log.warning("the installed libtpu does not know --%s: left out", name)
  flags = [(name, value) for name, value in TPU_FLAGS if name in known]
  return _logged(add(flags, environ, "LIBTPU_INIT_ARGS"), "libtpu flags", TPU_SWITCH) if flags else []


def known_flags(names: list[str], spec) -> set[str]:
  """The flag `names` that libtpu.so, of the module `spec`, contains (a scan, 0.2 s once cached)."""
  folder = (spec.submodule_search_locations or [os.path.dirname(spec.origin or "")])[0]
  library = os.path.join(folder, TPU_LIBRARY + ".so")
  if not os.path.isfile(library):
    return set()
  with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as contents:
    return {name for name in names if contents.find(name.encode()) != -1}


def apply(environ=os.environ) -> list[str]:
  """Both sets, where they apply; returns the flags added. A second call adds nothing."""
  return apply_gpu(environ) + apply_tpu(environ)


def _logged(added: list[str], what: str, switch: str) -> list[str]:
  if added:
    log.info("%s added (%s=0 leaves them out): %s", what, switch, " ".join(added))
  return added


def quiet_tpu_host_lookup():
  """Without TPU chips, libtpu (installed for the TPU compiler) still starts when JAX looks for devices and prints
  six lines of warnings about this host's TPU type and worker names: naming a local host and any accelerator type
  skips the look-up and changes nothing else. On a TPU VM nothing is set."""
  if hardware_utils.num_available_tpu_chips_and_device_id()[0] == 0:
    for name, value in TPU_HOST_VARIABLES.items():
      os.environ.setdefault(name, value)

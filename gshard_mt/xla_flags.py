"""The compiler flags every entry point sets before JAX starts a backend (`cli.run`): XLA_FLAGS where JAX will use
an NVIDIA GPU; a CPU or TPU gets none. An unknown flag aborts the process, so the GPU flags are tested against
jaxlib. A flag already set keeps the user's value; GSHARD_MT_GPU_FLAGS=0 sets none.

GPU: what MaxText's GPU scripts and NVIDIA's JAX-Toolbox recommend, measured faster on an H100 (docs/decisions.md).
Command buffers keep XLA's default, which already captures fusions and library calls (`--xla_gpu_graph_level` and
`--xla_gpu_experimental_triton_ragged_dot` no longer exist in jaxlib 0.12); the collectives' combine thresholds
tune many-GPU FSDP runs: the user's to set.

TPU: libtpu's defaults. SPARSECORE_GATHERS (every gather the SparseCores can do sent to them, v5p and v6e) is an
option, estimated faster but never run on a TPU: LIBTPU_INIT_ARGS=<the flag> tries it (docs/decisions.md).
"""

from __future__ import annotations

import importlib.util
import logging
import os

from jax._src import hardware_utils

# What `quiet_tpu_host_lookup` names where no TPU chip is present: a local host and any accelerator type.
TPU_HOST_VARIABLES = {"TPU_WORKER_HOSTNAMES": "localhost", "TPU_ACCELERATOR_TYPE": "v3-8"}

log = logging.getLogger(__name__)

GPU_SWITCH = "GSHARD_MT_GPU_FLAGS"
# (flag, value): why.
GPU_FLAGS = (
    ("xla_gpu_enable_latency_hiding_scheduler", "true"),  # overlaps collectives with compute (JAX-Toolbox's image)
    ("xla_gpu_enable_triton_gemm", "false"),  # cuBLAS for the matmuls rather than Triton's
    ("xla_gpu_enable_highest_priority_async_stream", "true"),  # collectives' stream first, so compute waits less
)
SPARSECORE_GATHERS = "--xla_tpu_offload_all_supported_gathers_to_sparsecore=true"  # an option (see above)
# JAX's CUDA plugins (`jax[cuda12]`, `jax[cuda13]`); without one JAX has no GPU backend.
CUDA_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin")
GPU_PLATFORMS = {"cuda", "gpu"}


def will_use_gpu(platforms: str) -> bool:
  """Whether JAX will start its CUDA backend, judged without starting it: JAX_PLATFORMS (comma-separated) is empty
  or names the GPU, and a CUDA plugin is installed (without a GPU, JAX stays on the CPU, where the flags change
  nothing)."""
  named = {p.strip() for p in platforms.split(",") if p.strip()}
  return (not named or bool(named & GPU_PLATFORMS)) and any(importlib.util.find_spec(m) for m in CUDA_PLUGINS)


def add(flags, environ=os.environ) -> list[str]:
  """Adds each (name, value) of `flags` that environ['XLA_FLAGS'] does not name already (the user's value wins);
  returns the flags added."""
  value = environ.get("XLA_FLAGS", "")
  named = {word.lstrip("-").split("=", 1)[0] for word in value.split()}
  added = [f"--{name}={setting}" for name, setting in flags if name not in named]
  environ["XLA_FLAGS"] = " ".join([value.strip(), *added]).strip()
  return added


def apply(environ=os.environ) -> list[str]:
  """Adds GPU_FLAGS to environ['XLA_FLAGS'] when JAX will use a GPU (unless GSHARD_MT_GPU_FLAGS=0); returns those
  added (a second call adds none)."""
  if environ.get(GPU_SWITCH, "1") == "0" or not will_use_gpu(environ.get("JAX_PLATFORMS", "")):
    return []
  if added := add(GPU_FLAGS, environ):
    log.info("GPU XLA flags added (%s=0 leaves them out): %s", GPU_SWITCH, " ".join(added))
  return added


def quiet_tpu_host_lookup():
  """Without TPU chips, libtpu (installed for the TPU compiler) still starts when JAX looks for devices and prints
  six lines of warnings about this host's TPU type and worker names: naming a local host and any accelerator type
  skips the look-up and changes nothing else. On a TPU VM nothing is set."""
  if hardware_utils.num_available_tpu_chips_and_device_id()[0] == 0:
    for name, value in TPU_HOST_VARIABLES.items():
      os.environ.setdefault(name, value)

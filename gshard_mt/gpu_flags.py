"""The XLA flags that every entry point sets on NVIDIA GPUs (`cli.run`, before JAX starts its backend, which reads
XLA_FLAGS once): those that MaxText's GPU training scripts and NVIDIA's JAX-Toolbox recommend, and that the
installed jaxlib knows (an unknown flag in XLA_FLAGS aborts the process; tests/unit/test_gpu_flags.py checks them).

A flag already in XLA_FLAGS keeps the user's value; GSHARD_MT_GPU_FLAGS=0 sets none. Left out: command buffers
(CUDA graphs) keep XLA's default, which already captures fusions and library calls; MaxText's
`--xla_gpu_graph_level=0` no longer exists, nor does `--xla_gpu_experimental_triton_ragged_dot` (jaxlib 0.12); the
collectives' combine thresholds and pipelining tune many-GPU FSDP runs and are left to the user's XLA_FLAGS.
"""

from __future__ import annotations

import importlib.util
import logging
import os

log = logging.getLogger(__name__)

SWITCH = "GSHARD_MT_GPU_FLAGS"
# (flag, value): why.
FLAGS = (
    ("xla_gpu_enable_latency_hiding_scheduler", "true"),  # overlaps collectives with compute (JAX-Toolbox's image)
    ("xla_gpu_enable_triton_gemm", "false"),  # cuBLAS for the matmuls rather than Triton's
    ("xla_gpu_enable_highest_priority_async_stream", "true"),  # collectives' stream first, so compute waits less
)
# JAX's CUDA plugins (`jax[cuda12]`, `jax[cuda13]`); without one JAX has no GPU backend.
CUDA_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin")
GPU_PLATFORMS = {"cuda", "gpu"}


def will_use_gpu(platforms: str) -> bool:
  """Whether JAX will start its CUDA backend, judged without starting it: a CUDA plugin is installed, and
  JAX_PLATFORMS (`platforms`, comma-separated) is empty or names the GPU. A plugin without a GPU leaves JAX on the
  CPU, where the flags change nothing."""
  named = {p.strip() for p in platforms.split(",") if p.strip()}
  if named and not named & GPU_PLATFORMS:
    return False
  return any(importlib.util.find_spec(module) is not None for module in CUDA_PLUGINS)


def merged(xla_flags: str, flags=FLAGS) -> tuple[str, list[str]]:
  """(XLA_FLAGS with each (name, value) of `flags` that it does not name already, the flags added)."""
  named = {word.lstrip("-").split("=", 1)[0] for word in xla_flags.split()}
  added = [f"--{name}={value}" for name, value in flags if name not in named]
  return " ".join([xla_flags.strip(), *added]).strip(), added


def add(flags, environ=os.environ) -> list[str]:
  """Adds each (name, value) of `flags` to environ['XLA_FLAGS'] that it does not name already (the user's value
  wins); returns the flags added. Before JAX starts its backend, which reads XLA_FLAGS once."""
  value, added = merged(environ.get("XLA_FLAGS", ""), flags)
  environ["XLA_FLAGS"] = value
  return added


def apply(environ=os.environ) -> list[str]:
  """Adds FLAGS to environ['XLA_FLAGS'] when JAX will use a GPU (unless GSHARD_MT_GPU_FLAGS=0) and logs the ones
  added; returns them. A second call adds nothing."""
  if environ.get(SWITCH, "1") == "0" or not will_use_gpu(environ.get("JAX_PLATFORMS", "")):
    return []
  added = add(FLAGS, environ)
  if added:
    log.info("GPU XLA flags added (%s=0 leaves them out): %s", SWITCH, " ".join(added))
  return added

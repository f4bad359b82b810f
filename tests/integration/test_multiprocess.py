"""Two processes x 4 CPU devices train with the same losses and gradients as one process x 8 devices
(jax.distributed on localhost), each process feeding its own rows and all of them writing the checkpoints; a
hybrid mesh with one process per slice does the same; a SIGTERM to one process stops both at the same step with a
checkpoint."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import pytest

from gshard_mt.training import checkpoint as checkpoint_lib
from gshard_mt.training.setup import build
from tests.helpers import ROOT, small_args, small_config
from tests.integration import multidevice_worker

pytestmark = pytest.mark.slow  # trains, compiles for many devices or starts processes

OVERRIDES = {"num_train_steps": 3, "moe.num_experts": 8, "moe.group_size": 24, "mesh.data": 2, "mesh.expert": 4}
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
GRAD_TOLERANCE = 5e-6  # relative, for each step's gradient norm and each leaf (measured: 9e-8 and 5.6e-7)


def command(workdir, **extra):
  return [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny.py"), "--workdir",
          str(workdir), *small_args(**{**OVERRIDES, **extra})]


def losses(workdir, key="loss"):
  return [json.loads(line)[key] for line in open(workdir / "metrics.jsonl") if f'"{key}"' in line]


def first_moment(workdir, vocab_size):
  """Adam's first moment in the step-3 checkpoint, restored onto one device: a decaying sum of the clipped
  gradients, each leaf scaled as its own gradients are."""
  setup = build(small_config(**{**OVERRIDES, "mesh.data": 1, "mesh.expert": 1}), vocab_size)
  with checkpoint_lib.Checkpoints(workdir / "checkpoints") as ckpts:
    _, state, _ = ckpts.restore(setup.abstract_target(), 3)
  return jax.device_get(multidevice_worker.first_moment(state.opt_state))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def start_two_processes(workdir, **extra) -> list[subprocess.Popen]:
  port = free_port()
  return [subprocess.Popen(command(workdir, **{"distributed.coordinator_address": f"localhost:{port}",
                                               "distributed.num_processes": 2, "distributed.process_id": i},
                                   **extra),
                           env=dict(ENV, JAX_NUM_CPU_DEVICES="4"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True) for i in range(2)]


def finish(workers) -> list[str]:
  outputs = [w.communicate(timeout=600)[0] for w in workers]
  for w, out in zip(workers, outputs):
    assert w.returncode == 0, out[-3000:]
  return outputs


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, tokenizer_dir):
  workdir = tmp_path_factory.mktemp("single")
  shutil.copytree(tokenizer_dir, workdir / "tokenizer")
  proc = subprocess.run(command(workdir), env=dict(ENV, JAX_NUM_CPU_DEVICES="8"), capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert len(losses(workdir)) == 3
  return workdir


# "hybrid": each process is one slice of a dcn_mesh, one data row of 4 expert devices.
@pytest.mark.parametrize("mesh", [{}, {"dcn_mesh.data": 2, "mesh.data": 1}], ids=["flat", "hybrid"])
def test_two_processes_match_one(tmp_path, tokenizer_dir, data, one_process, mesh):
  shutil.copytree(tokenizer_dir, tmp_path / "tokenizer")
  finish(start_two_processes(tmp_path, **mesh))
  assert len(losses(tmp_path)) == 3
  for a, b in zip(losses(tmp_path), losses(one_process)):
    assert abs(a - b) < 1e-5
  assert (tmp_path / "checkpoints" / "3").is_dir()
  # Adam's steps are about -lr * sign(g), blind to a gradient's scale: the gradients themselves, leaf by leaf
  # through Adam's first moment (after a clip common to all leaves), and by their norm at each step (before it).
  two, one = (first_moment(w, data.tokenizer.vocab_size) for w in (tmp_path, one_process))
  assert multidevice_worker.max_relative_diff(two, one) < GRAD_TOLERANCE
  for a, b in zip(losses(tmp_path, "grad_norm"), losses(one_process, "grad_norm")):
    assert abs(a / b - 1) < GRAD_TOLERANCE


LATE_PROCESS = """
import sys, time
import jax, jax.numpy as jnp, numpy as np
from gshard_mt.parallel import distributed
from tests.helpers import small_config
port, process_id = sys.argv[1:]
distributed.initialize_distributed(small_config(**{"distributed.coordinator_address": f"localhost:{port}",
                                                   "distributed.num_processes": 2,
                                                   "distributed.process_id": int(process_id)}))
sharding = jax.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()), ("d",)), jax.P("d"))
if process_id == "1":
  time.sleep(40)  # a first step compiled 40 s later than the other process's
x = jax.make_array_from_process_local_data(sharding, np.ones(4, np.float32))
print("total", float(jax.jit(lambda a: (a * 2).sum())(x)))
"""


def test_a_process_late_to_its_first_collective_over_every_device_is_waited_for():
  port = free_port()
  workers = [subprocess.Popen([sys.executable, "-c", LATE_PROCESS, str(port), str(i)], cwd=ROOT,
                              env=dict(ENV, JAX_NUM_CPU_DEVICES="4"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
  for out in finish(workers):
    assert "total 16.0" in out, out[-2000:]


def test_sigterm_to_one_process_stops_both_at_the_same_step(tmp_path, tokenizer_dir):
  shutil.copytree(tokenizer_dir, tmp_path / "tokenizer")
  workers = start_two_processes(tmp_path, num_train_steps=100000, checkpoint_every=100000)
  deadline = time.time() + 300
  while not (tmp_path / "metrics.jsonl").exists() or len(losses(tmp_path)) < 2:  # training is under way
    assert time.time() < deadline and all(w.poll() is None for w in workers)
    time.sleep(0.5)
  workers[1].send_signal(signal.SIGTERM)  # not process 0, which logs
  outputs = finish(workers)
  saved = [int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()]
  assert len(saved) == 1 and 2 <= saved[0] < 100000, saved
  for out in outputs:
    assert f"SIGTERM: saving a checkpoint at step {saved[0]}" in out

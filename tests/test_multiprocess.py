"""Two processes x 4 CPU devices train with the same losses as one process x 8 devices (jax.distributed on
localhost), each process feeding its own rows and all of them writing the checkpoints."""

import json
import os
import shutil
import socket
import subprocess
import sys

from conftest import ROOT

OVERRIDES = {"num_train_steps": 3, "checkpoint_every": 3, "eval_every": 0, "log_every": 1, "batch_size": 8,
             "data.languages": "fra,deu,spa,ell,kab", "data.vocab_size": 600, "data.max_length": 24,
             "model.emb_dim": 32, "model.num_heads": 2, "model.head_dim": 16, "model.mlp_dim": 64,
             "moe.num_experts": 8, "moe.hidden_dim": 64, "moe.group_size": 24, "data.prefetch": 1,
             "mesh.data": 2, "mesh.expert": 4}


def command(workdir, **extra):
  args = {**OVERRIDES, **extra}
  return [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny.py"), "--workdir",
          str(workdir)] + [f"--config.{k}={v}" for k, v in args.items()]


def losses(workdir):
  return [json.loads(line)["loss"] for line in open(workdir / "metrics.jsonl") if '"loss"' in line]


def test_two_processes_match_one(tmp_path, tokenizer_dir):
  single, multi = tmp_path / "single", tmp_path / "multi"
  for w in (single, multi):
    shutil.copytree(tokenizer_dir, w / "tokenizer")
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  proc = subprocess.run(command(single), env=dict(env, JAX_NUM_CPU_DEVICES="8"), capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  workers = [subprocess.Popen(command(multi, **{"distributed.coordinator_address": f"localhost:{port}",
                                               "distributed.num_processes": 2, "distributed.process_id": i}),
                              env=dict(env, JAX_NUM_CPU_DEVICES="4"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outputs = [w.communicate(timeout=600)[0] for w in workers]
  for w, out in zip(workers, outputs):
    assert w.returncode == 0, out[-3000:]
  assert len(losses(single)) == 3
  for a, b in zip(losses(multi), losses(single)):
    assert abs(a - b) < 1e-5
  assert (multi / "checkpoints" / "3").is_dir()

"""A work directory on object storage, end to end: two train.py processes, then eval.py and translate.py, all on
gs://bucket/run served from a local folder (tests/fake_storage.py), and nothing written to a local `gs:` folder."""

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.helpers import ROOT, fresh_env, small_args

pytestmark = pytest.mark.slow  # starts processes

RUN = "gs://bucket/run"


def on_storage(root, script, *args) -> list[str]:
  """The command that runs `script` with gs:// mapped onto `root`."""
  return [sys.executable, "-m", "tests.fake_storage", str(root), str(ROOT / script), *args]


def test_train_on_two_processes_then_eval_and_translate(tmp_path, tokenizer_dir):
  root, cwd = tmp_path / "storage", tmp_path / "cwd"
  cwd.mkdir()
  (root / "bucket" / "run").mkdir(parents=True, exist_ok=True)
  subprocess.run(["cp", "-r", str(tokenizer_dir), str(root / "bucket" / "run")], check=True)
  env = fresh_env(PYTHONPATH=str(ROOT), JAX_NUM_CPU_DEVICES="2")
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  train = [on_storage(root, "train.py", "--config", str(ROOT / "configs" / "tiny.py"), "--workdir", RUN,
                      *small_args(**{"mesh.data": 2, "mesh.expert": 2, "moe.group_size": 24,
                                     "distributed.num_processes": 2, "distributed.process_id": i,
                                     "distributed.coordinator_address": f"localhost:{port}"}))
           for i in range(2)]
  workers = [subprocess.Popen(c, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for c in train]
  for w in workers:
    out = w.communicate(timeout=600)[0]
    assert w.returncode == 0, out[-3000:]
  run = root / "bucket" / "run"
  rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]
  assert sorted(os.listdir(run / "checkpoints")) == ["3", "6"] and not (run / ".lock").exists()
  assert list((run / "tensorboard").iterdir()) and (run / "training.png").exists()

  env["JAX_NUM_CPU_DEVICES"] = "4"  # one process on the training mesh
  out = subprocess.run(on_storage(root, "eval.py", "--workdir", RUN, "--languages", "fra", "--beam_size", "1",
                                  "--max_decode_len", "8"),
                       env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"wrote {RUN}/eval/test-6-beam1-len8-fra/" in out.stdout
  scores = json.loads((run / "eval" / "test-6-beam1-len8-fra" / "scores.json").read_text())
  hyps = (run / "eval" / "test-6-beam1-len8-fra" / "hyp.fra.txt").read_text().splitlines()
  assert scores["languages"]["fra"]["sentences"] == len(hyps) == 100

  out = subprocess.run(on_storage(root, "translate.py", "--workdir", RUN, "--src_lang", "fra", "--beam_size", "1",
                                  "--max_decode_len", "8"),
                       env=env, cwd=cwd, input="Je suis content.\nMerci !\n", capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert len(out.stdout.splitlines()) == 2
  assert os.listdir(cwd) == []  # no local folder named gs:

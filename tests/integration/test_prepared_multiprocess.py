"""Two processes (jax.distributed on localhost) get their data as train.py does: process 0 prepares the corpus into a
shared data.prepared_dir while the other waits, then both memory-map the same shards and each builds its own rows of
the batches that one process builds whole."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from gshard_mt.data import pipeline
from gshard_mt.data import prepare as prepare_lib
from tests.helpers import ROOT, small_config

pytestmark = pytest.mark.slow  # starts processes


def test_two_processes_read_the_shards_that_process_0_prepared(tmp_path, monkeypatch):
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_NUM_CPU_DEVICES="1")
  workers = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "integration" / "prepared_worker.py"), str(port),
                               str(i), str(tmp_path / "run"), str(tmp_path / "prepared"), str(tmp_path / f"{i}.npz")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outputs = [w.communicate(timeout=300)[0] for w in workers]
  for w, out in zip(workers, outputs):
    assert w.returncode == 0, out[-3000:]
  assert ["prepared 4000 train pairs" in out for out in outputs] == [True, False]  # process 0 alone prepared
  rows = [np.load(tmp_path / f"{i}.npz") for i in range(2)]
  assert str(rows[0]["directory"]) == str(rows[1]["directory"])
  assert [p.name for p in (tmp_path / "prepared").iterdir()] == [os.path.basename(str(rows[0]["directory"]))]
  config = small_config(**{"data.prepared_dir": str(tmp_path / "prepared")})
  monkeypatch.setattr(prepare_lib, "build", lambda *a: pytest.fail("prepared again"))
  whole = pipeline.load(config, tmp_path / "run").train_batches(config)
  for i in range(3):
    for key, value in whole.batch(i).items():
      np.testing.assert_array_equal(np.concatenate([r[f"{i}/{key}"] for r in rows]), value)

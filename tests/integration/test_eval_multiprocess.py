"""eval.py and translate.py on two processes (jax.distributed on localhost, one CPU device each) give what one
process gives on the same mesh of two devices: the same hypotheses and scores. The experts are split over the two
processes, as a model that only fits a pod is. Each process is given its own copy of the work directory, and
process 1 stdin with nothing in it: process 0 alone reads the input, writes and prints."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from gshard_mt.data import sources as sources_lib
from gshard_mt.tools import translate
from tests.helpers import ROOT, initialised_run, small_config

pytestmark = pytest.mark.slow  # trains, compiles for many devices or starts processes

ROWS = 14  # a batch: 7 rows on each device; the 100 French test sentences give 8 batches, the last one padded
DECODING = ["--beam_size", "2", "--max_decode_len", "8", "--batch_size", str(ROWS)]
EVAL_ARGS = ["--split", "test", "--languages", "fra", *DECODING]
SENTENCES = 100


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer_dir):
  """An initialised model's checkpoint (the hypotheses need only differ between sentences), whose config.json says
  mesh.expert=2: its experts split over the two devices."""
  return initialised_run(tmp_path_factory.mktemp("eval_multiprocess") / "run", tokenizer_dir, **{"mesh.expert": 2})


def launch(script: str, workdirs: list, args: list[str], stdin: bytes, out) -> list[tuple]:
  """Starts `script` as one process on two CPU devices (one work directory) or as two processes on one device
  each (two: one each); process 0 gets `stdin`, process 1 nothing. Returns (process, file of its standard
  output, of its standard error) for each."""
  n = len(workdirs)
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  started = []
  for i, workdir in enumerate(workdirs):
    layout = [] if n == 1 else [f"--config.distributed.coordinator_address=localhost:{port}",
                                f"--config.distributed.num_processes={n}", f"--config.distributed.process_id={i}"]
    files = out / f"{script}.{n}.{i}.out", out / f"{script}.{n}.{i}.err"
    with open(files[0], "wb") as stdout, open(files[1], "wb") as stderr:
      proc = subprocess.Popen([sys.executable, str(ROOT / script), "--workdir", str(workdir), *args, *layout],
                              stdin=subprocess.PIPE, stdout=stdout, stderr=stderr, cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_NUM_CPU_DEVICES=str(2 // n)))
    started.append((proc, *files))
  for i, (proc, _, _) in enumerate(started):
    proc.stdin.write(stdin if i == 0 else b"")
    proc.stdin.close()
  return started


def finish(started: list[tuple]) -> list[str]:
  """The standard output of each process (less the lines Gloo, the CPU collectives, prints), once all succeeded."""
  outputs = []
  for proc, stdout, stderr in started:
    proc.wait(timeout=300)
    assert proc.returncode == 0, stderr.read_text()[-3000:]
    outputs.append("".join(line for line in stdout.read_text().splitlines(keepends=True)
                           if not line.startswith("[Gloo]")))
  return outputs


@pytest.fixture(scope="module")
def one_process(saved, tmp_path_factory):
  """eval.py as one process on two devices, in a copy of the work directory: (its output directory, its output)."""
  workdir = tmp_path_factory.mktemp("one_process") / "run"
  shutil.copytree(saved, workdir)
  [output] = finish(launch("eval.py", [workdir], EVAL_ARGS, b"", workdir.parent))
  return workdir / "eval" / "test-1-beam2-len8-bs14-fra", output


def test_eval_on_two_processes_writes_what_one_writes(saved, one_process, tmp_path):
  """Process 0 writes (and prints) the same hypotheses and scores as one process; process 1, given a copy of the
  work directory, writes nothing there."""
  for name in ("two0", "two1"):
    shutil.copytree(saved, tmp_path / name)
  outputs = finish(launch("eval.py", [tmp_path / "two0", tmp_path / "two1"], EVAL_ARGS, b"", tmp_path))
  single, double = one_process[0], tmp_path / "two0" / "eval" / "test-1-beam2-len8-bs14-fra"
  assert "wrote" in one_process[1] and "wrote" in outputs[0] and outputs[1] == ""
  assert not (tmp_path / "two1" / "eval").exists()
  assert sorted(p.name for p in single.iterdir()) == sorted(p.name for p in double.iterdir())
  hyps = (single / "hyp.fra.txt").read_text().splitlines()
  assert (double / "hyp.fra.txt").read_text().splitlines() == hyps
  assert len(hyps) == SENTENCES and len(set(hyps)) > SENTENCES // 4  # rows out of order would show
  a, b = (json.loads((d / "scores.json").read_text()) for d in (single, double))
  assert a["languages"] == b["languages"] and a["average"] == b["average"]
  assert a["decoding"]["sentences"] == b["decoding"]["sentences"] == SENTENCES


def test_translate_on_two_processes_prints_eval_hypotheses(saved, one_process, tmp_path):
  """translate.py on two processes prints what eval.py on one process wrote (the same sentences in the same
  batches); process 1, whose standard input is empty, prints nothing."""
  sources = sources_lib.load_corpus(small_config().data)[0]["test"]["fra"].src
  assert len(sources) <= ROWS * translate.WINDOW_BATCHES  # one window of input, sorted by length as eval.py's
  text = "".join(s + "\n" for s in sources).encode()
  outputs = finish(launch("translate.py", [saved, saved], ["--src_lang", "fra", *DECODING], text, tmp_path))
  assert outputs[0] == (one_process[0] / "hyp.fra.txt").read_text() and outputs[1] == ""

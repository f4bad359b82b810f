"""The dry run: the tiny configuration compiled for 8 fake devices, memory by kind, collectives, --require_fit."""

import json
import os
import re
import shlex
import subprocess
import sys

import jax
import numpy as np
import pytest

from gshard_mt import cli
from gshard_mt.model.transformer import Transformer, TransformerConfig, dummy_batch
from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # trains, compiles for many devices or starts processes

ARGS = ["--config", str(ROOT / "configs" / "tiny.py"), "--devices", "8", "--mesh", "data=2,expert=4",
        "--config.moe.group_size=16", "--config.model.num_encoder_layers=4", "--config.model.num_decoder_layers=4"]


def run_dryrun(out, *extra):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  env.pop("JAX_NUM_CPU_DEVICES", None)
  return subprocess.run([sys.executable, "-m", "gshard_mt.tools.dryrun", *ARGS, "--out", str(out), *extra], env=env,
                        capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  out = tmp_path_factory.mktemp("dryrun")
  proc = run_dryrun(out)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert (out / "dryrun.md").exists()
  return json.loads((out / "dryrun.json").read_text())


def test_reports_memory_and_collectives(report):
  assert report["devices"] == 8 and report["mesh"] == {"data": 2, "expert": 4, "model": 1}
  m = report["per_device_bytes"]
  assert 0 < m["parameters"] < m["argument"] and m["temp"] > 0 and m["peak"] > m["argument"]
  # 2 scanned units x (encoder + decoder MoE layer) x (dispatch + combine) x (forward + backward).
  assert report["collectives"]["all-to-all"]["count"] == 16 and report["collectives"]["all-to-all"]["ops"] == 8
  assert report["collectives"]["all-reduce"]["count"] > 0 and report["fits"]


def test_per_device_parameter_bytes_follow_the_shardings(report):
  """Expert weights are split 4 ways (the expert axis); every other parameter is replicated."""
  config = cli.load(ROOT / "configs" / "tiny.py", {"model.num_encoder_layers": "4",
                                                          "model.num_decoder_layers": "4"})
  shapes = jax.eval_shape(lambda: Transformer(TransformerConfig.from_config(config, config.data.vocab_size)).init(
      jax.random.key(0), dummy_batch(1, 8)))["params"]
  expected = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    key = jax.tree_util.keystr(path)
    nbytes = np.prod(leaf.shape) * 4
    expected += nbytes / 4 if "['moe']['wi']" in key or "['moe']['wo']" in key else nbytes
  assert report["per_device_bytes"]["parameters"] == pytest.approx(expected, rel=1e-6)
  assert report["parameters"] * 4 > report["per_device_bytes"]["parameters"]


def test_program_size_does_not_grow_with_the_device_count(tmp_path):
  """One SPMD program: with one expert and the same rows per device, 8 and 64 devices compile to the same
  per-device program (so compile time stays flat); XLA's CPU all-to-all decomposer, kept with --cpu_all_to_all,
  adds one operand per device to every all-to-all."""
  sizes = {}
  for devices, extra in ((8, []), (64, []), (64, ["--cpu_all_to_all"])):
    out = tmp_path / f"{devices}{''.join(extra)}"
    proc = run_dryrun(out, "--devices", str(devices), "--mesh", f"data=1,expert={devices}",
                      f"--config.moe.num_experts={devices}", f"--config.batch_size={2 * devices}",
                      "--config.moe.group_size=32", "--config.model.num_encoder_layers=2",
                      "--config.model.num_decoder_layers=2", *extra)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((out / "dryrun.json").read_text())
    assert report["collectives"]["all-to-all"]["count"] == 8
    sizes[(devices, bool(extra))] = report["hlo_instructions"]
  assert sizes[(64, False)] == pytest.approx(sizes[(8, False)], rel=0.02)  # 16,076 and 16,197 on JAX 0.12
  assert sizes[(64, True)] > 1.1 * sizes[(64, False)]  # 18,636: 8 all-to-alls x 64 operands


def test_does_not_fit_is_reported_and_fails_only_when_asked(tmp_path):
  proc = run_dryrun(tmp_path, "--hbm_gib", "0.001")
  assert proc.returncode == 0 and "does NOT fit" in proc.stdout and "GiB per device needed" in proc.stdout
  assert json.loads((tmp_path / "dryrun.json").read_text())["fits"] is False
  proc = run_dryrun(tmp_path, "--hbm_gib", "0.001", "--require_fit")
  assert proc.returncode == 1


def test_bad_mesh_is_a_config_error(tmp_path):
  proc = run_dryrun(tmp_path, "--mesh", "data=3,expert=4")
  assert proc.returncode != 0 and "does not match the 8 devices" in proc.stderr


def test_the_readme_example_shows_the_all_to_alls_and_says_what_it_changed(tmp_path):
  """The README's dry run, as written there: experts over 4 devices (all-to-alls), and the group size it had to
  change said in the report and the printed result, not only in a line of log."""
  example = re.search(r"`python -m gshard_mt\.tools\.dryrun ([^`]*)`", (ROOT / "README.md").read_text())[1]
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  env.pop("JAX_NUM_CPU_DEVICES", None)
  proc = subprocess.run([sys.executable, "-m", "gshard_mt.tools.dryrun", *shlex.split(example), "--out", str(tmp_path)],
                        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  report = json.loads((tmp_path / "dryrun.json").read_text())
  assert report["mesh"] == {"data": 2, "expert": 4, "model": 1} and report["collectives"]["all-to-all"]["count"] == 8
  assert report["changed"] == {"moe.group_size": [128, 16]}
  said = "moe.group_size=128 does not split over this mesh; using moe.group_size=16"
  assert f"**Changed from the config**: {said}" in proc.stdout and said in (tmp_path / "dryrun.md").read_text()

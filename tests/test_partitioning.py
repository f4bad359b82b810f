"""Partitioned training on 8 fake CPU devices (in a subprocess): every mesh computes what one device computes,
the all-to-all appears exactly when experts are split, expert weights are split and never gathered, and
checkpoints move between meshes."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def results(tmp_path_factory, tokenizer_dir):
  workdir = tmp_path_factory.mktemp("multidevice")
  shutil.copytree(tokenizer_dir, workdir / "tokenizer")
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="8", PYTHONPATH=f"{ROOT / 'tests'}{os.pathsep}{ROOT}")
  proc = subprocess.run([sys.executable, str(ROOT / "tests" / "multidevice_worker.py"), str(workdir)], env=env,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
  return json.loads(line[len("RESULT "):])


MESHES = ["8x1x1", "1x8x1", "2x4x1", "4x2x1", "2x2x2"]


@pytest.mark.parametrize("mesh", MESHES)
def test_same_step_as_one_device(results, mesh):
  one, r = results["meshes"]["1x1x1"], results["meshes"][mesh]
  assert abs(r["loss"] - one["loss"]) < 1e-5
  assert r["max_param_diff"] < 1e-5


@pytest.mark.parametrize("mesh", ["1x1x1"] + MESHES)
def test_all_to_all_exactly_when_experts_are_split(results, mesh):
  expert_axis = int(mesh.split("x")[1])
  r = results["meshes"][mesh]
  # 2 MoE layers (one in the encoder, one in the decoder), each: dispatch + combine, forward and backward.
  assert r["all_to_all"] == (8 if expert_axis > 1 else 0)
  assert r["all_gather_of_expert_weights"] == 0


@pytest.mark.parametrize("mesh", MESHES)
def test_each_device_holds_its_share_of_each_expert_weight(results, mesh):
  _, expert_axis, model_axis = (int(v) for v in mesh.split("x"))
  r = results["meshes"][mesh]
  layers, E, M, H = r["wi_shape"]
  assert r["wi_shard_shape"] == [layers, E // expert_axis, M, H // model_axis]


def test_checkpoint_restores_on_other_meshes(results):
  r = results["restore"]
  assert abs(r["8x1x1"] - r["2x4x1"]) < 1e-5 and abs(r["1x1x1"] - r["2x4x1"]) < 1e-5
  assert r["devices_8x1x1"] == 8 and r["devices_1x1x1"] == 1

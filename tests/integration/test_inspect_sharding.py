"""The sharding report as a command: 8 fake devices, the whole training step compiled."""

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # compiles for 8 fake devices in a subprocess


def run(*args):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  env.pop("JAX_NUM_CPU_DEVICES", None)
  return subprocess.run([sys.executable, "-m", "gshard_mt.tools.inspect_sharding", "--config",
                         str(ROOT / "configs" / "tiny.py"), "--config.moe.group_size=16", *args], env=env,
                        capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_report_for_expert_parallelism():
  proc = run("--mesh", "data=2,expert=4")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
  assert "GSEC,GSM->EGCM" in proc.stdout and "EGCM[E:expert G:data C:- M:-]" in proc.stdout
  assert proc.stdout.count("all-to-all over ['expert']") == 2
  assert "all-to-all              8 per step" in proc.stdout
  assert "per device: parameters" in proc.stdout


def test_missing_all_to_all_is_an_error():
  # The 'data' rules never use the expert axis: experts are not split and no all-to-all appears.
  proc = run("--mesh", "data=2,expert=4", "--config.partitioning=data")
  assert proc.returncode == 1 and "emitted no all-to-all" in proc.stdout

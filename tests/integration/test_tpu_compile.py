"""configs/tiny.py compiled by the real TPU compiler (libtpu, no TPU needed) for v3:2x2 and v5p:2x2x1: it
compiles; its MoE all-to-alls and per-device parameter bytes equal the fake-CPU dry run's on the same mesh; its
FLOPs with the scanned layers' loops counted equal the unrolled model's; the compiler's step-time estimate and a
bf16 matmul at the table's peak.

Every compile runs in one subprocess (this file run as a script): JAX's CPU device count is fixed once a process
starts, and libtpu is loaded once.
"""

import importlib
import json
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, fresh_env

pytestmark = pytest.mark.slow  # trains, compiles for many devices or starts processes
if sys.platform == "linux":  # .[test] installs libtpu on Linux: a missing or broken one fails here, never skips
  importlib.import_module("libtpu")
else:
  pytest.skip("libtpu (the TPU compiler) has wheels for Linux only", allow_module_level=True)

TINY = ROOT / "configs" / "tiny.py"


def worker() -> dict:
  from gshard_mt import xla_flags

  xla_flags.quiet_tpu_host_lookup()  # as every entry point does before JAX looks for devices
  import jax
  import jax.numpy as jnp

  jax.config.update("jax_num_cpu_devices", 8)
  from gshard_mt.tools import dryrun
  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  def report(devices, mesh, layers=2, with_time=True):
    start = time.perf_counter()
    config = dryrun.load_for(TINY, {**mesh, "model.num_encoder_layers": str(layers),
                                    "model.num_decoder_layers": str(layers)}, len(devices))
    r = dryrun.dry_run(config, devices, with_time)
    print(f"{devices[0].device_kind}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return {"moe_all_to_all": r["moe_collectives"]["all-to-all"]["count"],
            "all_to_all": r["collectives"]["all-to-all"]["count"], "loops": r["loop_trip_counts"],
            "per_device_bytes": r["per_device_bytes"], "kind": r["device_kind"], "estimate": r.get("estimate"),
            "pallas_calls": r["pallas_calls"]}

  cpu = jax.devices("cpu")
  v3_mesh, v5p_mesh = {"mesh.data": "2", "mesh.expert": "4"}, {"mesh.data": "2", "mesh.expert": "2"}
  out = {"cpu8": report(cpu[:8], v3_mesh, layers=4), "v3": report(tpu.topology_devices("v3:2x2"), v3_mesh, layers=4),
         "cpu4": report(cpu[:4], v5p_mesh), "v5p": report(tpu.topology_devices("v5p:2x2x1"), v5p_mesh),
         "v5p_loss_kernel": report(tpu.topology_devices("v5p:2x2x1"), v5p_mesh | {"optimizer.loss_kernel": "pallas"},
                                   with_time=False)}
  one_core = jax.sharding.SingleDeviceSharding(tpu.topology_devices("v3:1x1")[0])
  a = jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16, sharding=one_core)
  cost = tpu.compiler_cost(jax.jit(jnp.matmul).lower(a, a).compile())
  out["matmul_flops_per_second"] = cost["flops"] / cost["optimal_seconds"]
  return out


@pytest.fixture(scope="module")
def compiled():
  env = fresh_env(PYTHONPATH=str(ROOT))
  env.pop("JAX_NUM_CPU_DEVICES", None)
  proc = subprocess.run([sys.executable, "-m", "tests.integration.test_tpu_compile"], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  assert "TPU_ACCELERATOR_TYPE" not in proc.stderr  # libtpu's host look-up warnings are silenced
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tpu, cpu, kind, moe_all_to_alls", [  # at least dispatch and combine, forward and backward
    ("v3", "cpu8", "TPU v3", 2 * 2 * 2 * 2),  # 2 units x (encoder + decoder) x (dispatch + combine) x (fwd + bwd)
    ("v5p", "cpu4", "TPU v5", 1 * 2 * 2 * 2),
])
def test_tpu_program_matches_the_cpu_dry_run(compiled, tpu, cpu, kind, moe_all_to_alls):
  t, c = compiled[tpu], compiled[cpu]
  assert t["kind"] == kind
  # The scanned layers' loops, their trip counts read from the TPU program's conditions (it writes none); the
  # CPU program has more loops (its random-bit generator's).
  assert t["loops"] == ([2, 2, 2, 2] if tpu == "v3" else [])
  assert t["moe_all_to_all"] == c["moe_all_to_all"] >= moe_all_to_alls
  assert t["all_to_all"] >= t["moe_all_to_all"]  # the TPU partitioner may reshard other tensors with all-to-alls
  assert t["per_device_bytes"]["parameters"] == c["per_device_bytes"]["parameters"]
  assert t["per_device_bytes"]["optimizer_state"] == c["per_device_bytes"]["optimizer_state"]
  assert 0 < t["per_device_bytes"]["peak"] < 2**30


def test_the_default_tpu_step_has_no_pallas_kernel(compiled):
  """The default path is plain JAX on a TPU too: no Mosaic custom call unless a kernel option asks for one (here
  optimizer.loss_kernel='pallas': one kernel, in the loss's forward)."""
  assert compiled["v3"]["pallas_calls"] == compiled["v5p"]["pallas_calls"] == 0
  assert compiled["v5p_loss_kernel"]["pallas_calls"] >= 1


def test_flops_count_the_scanned_layers_like_the_unrolled_model(compiled):
  """The unrolled 2-unit compile behind the step time is the unrolled model: its FLOPs match the scanned
  program's with the loops counted; the compiler's own count (loop bodies once) is far below."""
  est = compiled["v3"]["estimate"]
  assert est["flops_per_device"] == pytest.approx(est["step_flops_per_device"], rel=0.02)
  assert est["compiler_flops_per_device"] < 0.8 * est["flops_per_device"]
  assert est["time_compiles"] == 2 and list(est["depth_points"]) == ["1+1", "2+2"]
  assert all(p["uncounted_loops"] == 0 for p in est["depth_points"].values())
  assert est["step_seconds"] > 0 and 0 < est["mfu_bound"] < 1
  assert est["model_flops_per_step"] < est["flops_per_device"] * 8  # the compiler's count adds attention, Adam, ...
  v5p = compiled["v5p"]["estimate"]  # one unit per stack: the configured program is exact, no more compiles
  assert v5p["time_compiles"] == 0 and v5p["flops_per_device"] == pytest.approx(v5p["step_flops_per_device"])
  assert v5p["chip"] == "v5p" and v5p["hbm_bytes_per_device"] == 95 * 2**30


def test_a_large_bf16_matmul_runs_at_the_tables_peak(compiled):
  from gshard_mt.tpu.estimates import tpu_compiler as tpu

  assert compiled["matmul_flops_per_second"] == pytest.approx(tpu.chip_of("v3").peak_flops_per_core, rel=0.01)


if __name__ == "__main__":
  print(json.dumps(worker()))

"""model.attention='pallas' (Pallas kernels reading the segment ids; Pallas's interpret mode on the CPU) against
'xla' (the einsum reference): outputs and gradients of self, causal and cross attention on packed rows, in blocks of
8 rows and in one block; the whole model's loss and gradients, on one device and under shard_map on a mesh; the
kernels' declared cost; the config's refusal of attention dropout."""

import logging
import os
import subprocess
import sys

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from gshard_mt import config as config_lib
from gshard_mt.errors import ConfigError
from gshard_mt.model import pallas_attention
from tests.helpers import ROOT, small_config
from tests.unit.test_fused_attention import (
  attention_outputs_and_gradients,
  packed_batch,
  relative_error,
  transformer_loss_and_grads,
)


@pytest.mark.parametrize("rows", [16, 3], ids=["blocks-of-8", "one-block"])
@pytest.mark.parametrize("cross, causal", [(False, False), (False, True), (True, False)],
                         ids=["self", "causal", "cross"])
def test_pallas_equals_xla_on_packed_rows(cross, causal, rows):
  out, grads = attention_outputs_and_gradients("pallas", jnp.float32, cross, causal, B=rows)
  want_out, want_grads = attention_outputs_and_gradients("xla", jnp.float32, cross, causal, B=rows)
  np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
  assert relative_error(grads, want_grads) < 1e-5


def test_transformer_loss_and_gradients_equal_xla():
  """A training step's loss (MoE layers, residual dropout on) and its gradients, from the same parameters."""
  config = small_config(**{"model.dtype": "float32", "model.dropout_rate": "0.1"})
  batch = packed_batch(config.batch_size, config.data.max_length, config.data.vocab_size)
  (loss, grads), (want_loss, want_grads) = (transformer_loss_and_grads(config, a, batch) for a in ("pallas", "xla"))
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
  assert relative_error(grads, want_grads) < 1e-5


def shard_map_check():
  """Run in a process with 4 CPU devices: loss and gradients of 'pallas' on the config's mesh (rows split 4 ways
  over 'data', the kernels under shard_map) against 'xla' on one device."""
  import flax.linen as nn

  from gshard_mt.training.setup import build

  config = small_config(**{"model.dtype": "float32", "model.dropout_rate": "0.0", "batch_size": "16",
                           "mesh.data": "4"})
  batch = packed_batch(16, config.data.max_length, config.data.vocab_size)
  want_loss, want_grads = transformer_loss_and_grads(config, "xla", batch)
  setup = build(config, config.data.vocab_size)
  with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
    loss, grads = transformer_loss_and_grads(config, "pallas", batch)
    text = jax.jit(lambda: transformer_loss_and_grads(config, "pallas", batch)).lower().as_text()
  assert setup.mesh.shape["data"] == 4 and "manual_computation" in text, text[:2000]
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
  assert relative_error(grads, want_grads) < 1e-5
  print("OK")


@pytest.mark.slow
def test_kernels_run_per_device_under_shard_map():
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="4", PYTHONPATH=str(ROOT))
  code = "from tests.unit.test_pallas_attention import shard_map_check; shard_map_check()"
  proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout[-2000:] + proc.stderr[-3000:]


def declared_cost(kernel, arrays, outputs, matmuls):
  B, Q = arrays[0].shape[:2]
  K = arrays[1].shape[1]
  ids = (jax.ShapeDtypeStruct((B, Q), jnp.int32), jax.ShapeDtypeStruct((B, K), jnp.int32))
  jaxpr = jax.make_jaxpr(lambda *a: pallas_attention._call(kernel, a[:-2], *a[-2:], outputs, matmuls, 4, False))(
      *arrays, *ids)
  # platform_dependent holds a branch per platform, the TPU kernel and the interpreted one, each with the cost
  costs = [e.params["cost_estimate"] for e in _pallas_calls(jaxpr.jaxpr)]
  assert len(costs) == 2 and costs[0] == costs[1]
  return costs[0]


def _pallas_calls(jaxpr):
  """Every pallas_call equation in `jaxpr` and the jaxprs in its equations' parameters (branches, bodies)."""
  for e in jaxpr.eqns:
    if e.primitive.name == "pallas_call":
      yield e
      continue
    for value in e.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(sub, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
          yield from _pallas_calls(getattr(sub, "jaxpr", sub))


def test_declared_cost_counts_the_matmuls_and_bytes():
  B, Q, K, AD = 8, 16, 24, 32
  x = lambda L: jax.ShapeDtypeStruct((B, L, AD), jnp.bfloat16)  # noqa: E731
  forward = declared_cost(pallas_attention._forward_kernel, (x(Q), x(K), x(K)), (0,), 2)
  assert isinstance(forward, pl.CostEstimate)
  assert forward.flops == 2 * 2 * B * Q * K * AD  # QK^T and PV over every head's D columns
  assert forward.bytes_accessed == 2 * (B * Q * AD + 2 * B * K * AD + B * Q * AD) + 4 * B * (Q + K)
  backward = declared_cost(pallas_attention._backward_kernel, (x(Q), x(K), x(K), x(Q)), (0, 1, 2), 5)
  assert backward.flops == 5 * 2 * B * Q * K * AD  # the scores again, dv, dp, dq, dk
  # q, k, v, do in; dq, dk, dv out (bf16); the segment ids (int32)
  assert backward.bytes_accessed == 2 * B * AD * ((2 * Q + 2 * K) + (Q + 2 * K)) + 4 * B * (Q + K)


def test_pallas_attention_refuses_attention_dropout():
  with pytest.raises(ConfigError, match=r"model.attention='pallas' has no attention dropout: it needs "
                                        r"model.attention_dropout_rate=0, not 0.1"):
    config_lib.load(ROOT / "configs" / "tiny.py", {"model.attention": "pallas", "model.attention_dropout_rate": "0.1"})


def test_build_warns_that_it_is_interpreted_off_a_tpu(caplog):
  from gshard_mt.training.setup import build

  with caplog.at_level(logging.WARNING, logger="gshard_mt.training.setup"):
    build(small_config(**{"model.attention": "pallas"}), 600)
  assert "model.attention='pallas' runs its kernels in Pallas's interpret mode off a TPU (cpu)" in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="gshard_mt.training.setup"):
    build(small_config(), 600)
  assert "interpret mode" not in caplog.text

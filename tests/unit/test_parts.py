"""The parts of a training step (one table for the TPU estimate and the measured profile): which part an
operation belongs to, and every instruction of a compiled program with its part and whether it is a matmul."""

import re

import jax
import jax.numpy as jnp
import pytest

from gshard_mt.tpu.estimates import parts

STEP = "jit(train_step)/jvp(Transformer)/Transformer.encode/encoder/while/body/eval_jaxpr/units"


@pytest.mark.parametrize("op_name, part", [
    (f"{STEP}/layer_0/ffn/Dropout_0/jit(_bernoulli)/jit(_uniform)/rng_bit_generator", "dropout"),  # before the FFN
    (f"{STEP}/layer_0/self_attention/Dropout_0/mul", "dropout"),
    ("jit(train_step)/jvp(Transformer)/Transformer.encode/Transformer._embed/dropout/select_n", "dropout"),
    (f"{STEP}/layer_1/moe/jit(_uniform)/while", "MoE router, gating, dispatch, combine"),  # random routing's bits
    (f"{STEP}/layer_1/moe/EGCM,EMH->EGCH/dot_general", "MoE expert matmuls"),
    # weight_einsum's backward: the input's and the weight's gradients
    (f"{STEP}/layer_1/moe/EGCH,EMH->EGCM/dot_general", "MoE expert matmuls"),
    (f"{STEP}/layer_1/moe/EGCH,EGCM->EHM/dot_general", "MoE expert matmuls"),
    (f"{STEP}/layer_1/moe/shard_map/cond/branch_0_fun/pallas_call", "MoE expert matmuls"),  # moe.expert_kernel
    (f"{STEP}/layer_1/moe/GSM,ME->GSE/dot_general", "MoE router, gating, dispatch, combine"),
    ("jit(train_step)/jvp(Transformer)/Transformer.decode_logits/BLM,MV->BLV/dot_general", "logits and cross-entropy"),
    ("jit(train_step)/transpose(jvp(Transformer))/Transformer.decode_logits/BLV,MV->BLM/dot_general",
     "logits and cross-entropy"),
    ("jit(train_step)/transpose(jvp(Transformer))/Transformer.decode_logits/BLM,BLV->MV/dot_general",
     "logits and cross-entropy"),
    ("jit(train_step)/transpose(jvp(Transformer))/Transformer.decode_logits/decoder/final_norm/mul",
     "layer norms, residuals, embeddings, rest"),
    (f"{STEP}/layer_0/self_attention/BLHD,BKHD->BHLK/dot_general", "attention"),
    (f"{STEP}/layer_0/ffn/BLM,MF->BLF/dot_general", "dense FFN"),
    (f"{STEP}/layer_0/pre_ffn_norm/rsqrt", "layer norms, residuals, embeddings, rest"),
    ("jit(train_step)/mul", "optimizer, gradient norm, finite check"),
])
def test_part_of(op_name, part):
  assert parts.part_of(("/x/gshard_mt/model/layers.py", "f"), op_name, "fusion") == part


@pytest.mark.parametrize("function", ["kernel", "_backward", "reference"])
def test_the_losss_reductions_are_the_loss(function):
  # kernels.logit_stats, whose kernel runs under shard_map outside the model's operations
  assert parts.part_of(("/x/gshard_mt/kernels/logit_stats.py", function), "jit(train_step)/shard_map/pallas_call",
                       "custom-call") == "logits and cross-entropy"


@pytest.mark.parametrize("frame", [("/x/gshard_mt/moe/grouped.py", "<lambda>"), ("/x/gshard_mt/moe/grouped.py",
                                                                                "by_rows")])
def test_the_grouped_matmuls_are_expert_matmuls(frame):
  # XLA's ragged_dot and the Mosaic GPU kernels (whose operation is named 'body') by their frame in moe/grouped.py
  assert parts.part_of(frame, f"{STEP}/layer_1/moe/body/mpmd_map", "custom-call") == "MoE expert matmuls"
  assert parts.part_of(("/x/gshard_mt/moe/grouped.py", "_forward"), f"{STEP}/layer_1/moe/max",
                       "fusion") == "MoE router, gating, dispatch, combine"  # the activation between them


@pytest.mark.parametrize("function", ["normalize", "norm_terms"])
def test_the_norm_before_attention_is_a_layer_norm(function):
  # applied inside the Attention module, whose name is in its operations
  assert parts.part_of(("/x/gshard_mt/model/layers.py", function), f"{STEP}/layer_0/self_attention/rsqrt",
                       "fusion") == "layer norms, residuals, embeddings, rest"


def test_collectives_by_opcode():
  assert parts.part_of(("", ""), f"{STEP}/layer_1/moe/x", "all-to-all") == "collectives"


def test_instructions_without_a_jax_operation():
  # A scanned step's loop buffers (a broadcast of zeros, a dynamic-update-slice) carry no metadata: they are XLA's.
  assert parts.part_of(("", ""), "", "fusion") == "XLA's own: loop buffers, copies"
  assert parts.part_of(("", ""), "", "all-reduce") == "collectives"
  assert parts.part_of(("/x/optax/_src/factorized.py", "f"), "", "fusion") == "optimizer, gradient norm, finite check"


def test_every_instruction_of_a_compiled_program():
  def f(x, w, key):
    with jax.named_scope("Transformer"), jax.named_scope("ffn"):
      h = jnp.tanh(x @ w)
      with jax.named_scope("Dropout_0"):
        h = jnp.where(jax.random.bernoulli(key, 0.9, h.shape), h / 0.9, 0)
    return h.sum()

  x = jnp.ones((64, 32))
  text = jax.jit(f).lower(x, jnp.ones((32, 48)), jax.random.key(0)).compile().as_text()
  ops = parts.instructions(text)
  names = re.findall(r"^\s*(?:ROOT )?%?([\w.\-]+) = ", text, re.MULTILINE)
  assert set(ops) == set(names)  # every instruction, fusions' insides too
  matmuls = [op for op in ops.values() if op["matmul"]]
  assert matmuls and all(op["part"] == "dense FFN" for op in matmuls)  # the dot, and the fusion around it
  assert any(op["opcode"] == "fusion" for op in matmuls)
  assert {op["part"] for op in ops.values() if "Dropout_0" in op["op_name"]} == {"dropout"}
  assert ops[next(n for n in ops if n.startswith("dot"))]["op_name"].endswith("Transformer/ffn/dot_general")


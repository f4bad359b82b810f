"""The names of M2M100's (NLLB-200's) and NllbMoe's (NLLB-MoE's) tensors in this model's parameters, both ways:
one table, `LAYER`, read by the import (`tensor_place`) and the export (`hf_tensors`).

A place is (leaf path, index): the leaf of this model's parameter tree, and where in it the tensor goes: its unit
u along the scanned layers' leading [U] axis (model.scan_layers), and its expert e along [E]. Layer i of a stack is
layer j = i % unit_size of unit u = i // unit_size; NllbMoe's sparse layers, (i + 1) % sparse_step == 0, are the
last of each unit, as model.moe_interval places them. Letters: M model dim, A heads, D head dim, F and H hidden,
E experts, V vocabulary.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

from gshard_mt.errors import WorkdirError

M2M100, NLLB_MOE = "m2m_100", "nllb-moe"  # config.json's model_type
STACKS = ("encoder", "decoder")
# Transforms between torch's Linear weights [out, in] and this model's kernels: ('qkv') [A*D, M] <-> [M, A, D];
# ('out') [M, A*D] <-> [A, D, M]; ('linear') [out, in] <-> [in, out]; ('flat') [A*D] <-> [A, D]; ('copy').
PROJECTIONS = {"q_proj": "query", "k_proj": "key", "v_proj": "value"}


def _attention(hf: str, ours: str) -> list[tuple[str, tuple, str]]:
  rules = [(f"{hf}.{p}.weight", (ours, name), "qkv") for p, name in PROJECTIONS.items()]
  rules += [(f"{hf}.{p}.bias", (ours, f"{name}_bias"), "flat") for p, name in PROJECTIONS.items()]
  return rules + [(f"{hf}.out_proj.weight", (ours, "out"), "out"), (f"{hf}.out_proj.bias", (ours, "out_bias"), "copy")]


def _norm(hf: str, ours: str) -> list[tuple[str, tuple, str]]:
  return [(f"{hf}.weight", (ours, "scale"), "copy"), (f"{hf}.bias", (ours, "bias"), "copy")]


def _ffn(hf: str, ours: str) -> list[tuple[str, tuple, str]]:
  p = f"{hf}." if hf else ""
  return [(f"{p}fc1.weight", (ours, "wi"), "linear"), (f"{p}fc1.bias", (ours, "bi"), "copy"),
          (f"{p}fc2.weight", (ours, "wo"), "linear"), (f"{p}fc2.bias", (ours, "bo"), "copy")]


def layer_rules(kind: str, decoder: bool, sparse: bool) -> list[tuple[str, tuple, str]]:
  """(HF name under `layers.{i}.`, this model's path under its layer, transform) of one layer; an expert's
  names hold '{e}'."""
  moe = kind == NLLB_MOE
  rules = _attention("self_attn", "self_attention") + _norm("self_attn_layer_norm", "pre_self_attention")
  if decoder:
    cross = "cross_attention" if moe else "encoder_attn"
    rules += _attention(cross, "cross_attention") + _norm(f"{cross}_layer_norm", "pre_cross_attention")
  rules += _norm("ff_layer_norm" if moe else "final_layer_norm", "pre_ffn")
  if sparse:
    return rules + [("ffn.router.classifier.weight", ("moe", "wg"), "linear")] + _ffn("ffn.experts.expert_{e}", "moe")
  return rules + _ffn("ffn" if moe else "", "ffn")


def to_ours(transform: str, array: np.ndarray, shape: tuple) -> np.ndarray:
  """An HF tensor -> this model's array of `shape`."""
  if transform in ("qkv", "out", "linear"):
    array = array.T
  return np.ascontiguousarray(array.reshape(shape))


def to_hf(transform: str, array: np.ndarray) -> np.ndarray:
  """This model's array -> the HF tensor."""
  if transform == "qkv":
    return array.reshape(array.shape[0], -1).T
  if transform == "out":
    return array.reshape(-1, array.shape[-1]).T
  if transform == "flat":
    return array.reshape(-1)
  return array.T if transform == "linear" else array


def layer_prefix(stack: str, i: int, unit_size: int, scanned: bool) -> tuple[tuple, tuple]:
  """(path prefix, index) of layer i of `stack` in the parameter tree."""
  u, j = divmod(i, unit_size)
  return ((stack, "units", f"layer_{j}"), (u,)) if scanned else ((stack, f"unit_{u}", f"layer_{j}"), ())


def tensor_place(name: str, kind: str, unit_size: int, scanned: bool, tied: bool) -> tuple[tuple, tuple, str] | None:
  """(leaf path, index, transform) of the HF tensor `name`, or None for one this model does not keep (the tied
  copies of the shared embedding). A name outside the architecture is a WorkdirError."""
  if name in ("model.shared.weight",):
    return ("embed", "embedding"), (), "copy"
  if name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight") or (
      tied and name == "lm_head.weight"):
    return None
  if name == "lm_head.weight":
    return ("logits",), (), "linear"
  if match := re.fullmatch(r"model\.(encoder|decoder)\.layer_norm\.(weight|bias)", name):
    return (match[1], "final_norm", "scale" if match[2] == "weight" else "bias"), (), "copy"
  if match := re.fullmatch(r"model\.(encoder|decoder)\.layers\.(\d+)\.(.+)", name):
    stack, i, rest = match[1], int(match[2]), match[3]
    prefix, index = layer_prefix(stack, i, unit_size, scanned)
    sparse = kind == NLLB_MOE and rest.startswith("ffn.") and not rest.startswith(("ffn.fc1", "ffn.fc2"))
    for hf, ours, transform in layer_rules(kind, stack == "decoder", sparse):
      pattern = re.escape(hf).replace(r"\{e\}", r"(\d+)")
      if found := re.fullmatch(pattern, rest):
        return prefix + ours, index + tuple(int(g) for g in found.groups()), transform
  raise WorkdirError(f"tensor {name!r}: not a tensor of a {kind} model this project reads")


def hf_tensors(params: dict, kind: str, num_layers: dict, unit_size: int, scanned: bool, num_experts: int,
               tied: bool) -> Iterator[tuple[str, np.ndarray]]:
  """(HF name, tensor) of every tensor of the HF model, from this model's flattened parameters {path: array}
  (numpy); a bias the model lacks (model.bias, moe.expert_bias off) is written as zeros, which computes the same."""
  yield "model.shared.weight", params[("embed", "embedding")]
  if not tied:
    yield "lm_head.weight", to_hf("linear", params[("logits",)])
  for stack in STACKS:
    for i in range(num_layers[stack]):
      prefix, index = layer_prefix(stack, i, unit_size, scanned)
      sparse = kind == NLLB_MOE and (i + 1) % unit_size == 0
      for hf, ours, transform in layer_rules(kind, stack == "decoder", sparse):
        for e in range(num_experts) if "{e}" in hf else (None,):
          where = index + (() if e is None else (e,))
          yield f"model.{stack}.layers.{i}.{hf.format(e=e)}", to_hf(transform, _leaf(params, prefix, ours, where))
    yield f"model.{stack}.layer_norm.weight", params[(stack, "final_norm", "scale")]
    yield f"model.{stack}.layer_norm.bias", params[(stack, "final_norm", "bias")]


def _leaf(params: dict, prefix: tuple, ours: tuple, index: tuple) -> np.ndarray:
  """The array at `index` of the leaf prefix + ours; zeros for a bias the model does not have."""
  path = prefix + ours
  if path in params:
    return np.asarray(params[path][index])
  bias_of = {"bi": "wi", "bo": "wo", "query_bias": "query", "key_bias": "key", "value_bias": "value",
             "out_bias": "out"}
  weight = np.asarray(params[prefix + ours[:-1] + (bias_of[ours[-1]],)][index])
  shape = {"bi": weight.shape[-1:], "bo": weight.shape[-1:], "out_bias": weight.shape[-1:]}.get(
      ours[-1], weight.shape[1:])
  return np.zeros(shape, weight.dtype)

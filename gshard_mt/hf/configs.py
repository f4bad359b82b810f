"""transformers' config.json of an M2M100 (NLLB-200) or NllbMoe (NLLB-MoE) model <-> this project's config keys.

`overrides` reads one into the keys of a run that computes what the HF model computes (float32); `hf_config`
writes a run's back, refusing in one line each option those classes cannot express.
"""

from __future__ import annotations

from gshard_mt.errors import UserError
from gshard_mt.hf.names import M2M100, NLLB_MOE
from gshard_mt.moe import gating

ARCHITECTURES = {M2M100: "M2M100ForConditionalGeneration", NLLB_MOE: "NllbMoeForConditionalGeneration"}
LAYER_NORM_EPSILON = 1e-5  # torch's LayerNorm default, which both classes use
# HF option -> the value this project computes (anything else is refused on import)
REQUIRED = {"activation_function": "relu", "scale_embedding": True, "router_bias": False,
            "batch_prioritized_routing": False, "router_dtype": "float32"}


def overrides(hf: dict, where: str) -> dict:
  """config.json's options -> this project's config keys {dotted key: value}; `where` names the file in errors."""
  kind = hf.get("model_type")
  if kind not in ARCHITECTURES:
    raise UserError(f"{where}: model_type={kind!r} is not one this project reads: {tuple(ARCHITECTURES)}")
  for key, value in REQUIRED.items():
    if key in hf and hf[key] != value:
      raise UserError(f"{where}: {key}={hf[key]!r} is not supported (only {value!r})")
  for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
    if hf[a] != hf[b]:
      raise UserError(f"{where}: {a}={hf[a]} and {b}={hf[b]} differ; this model has one value for both")
  heads = hf["encoder_attention_heads"]
  keys = {"model.emb_dim": hf["d_model"], "model.num_heads": heads, "model.head_dim": hf["d_model"] // heads,
          "model.mlp_dim": hf["encoder_ffn_dim"], "model.num_encoder_layers": hf["encoder_layers"],
          "model.num_decoder_layers": hf["decoder_layers"], "model.moe_interval": 0,
          "model.share_embeddings": True, "model.tied_logits": hf.get("tie_word_embeddings", True),
          "model.embedding": "vaswani", "model.positions": "sinusoidal",
          "model.position_offset": hf["pad_token_id"] + 1,
          "model.bias": True, "model.layer_norm_epsilon": LAYER_NORM_EPSILON, "model.dropout_rate": hf["dropout"],
          "model.attention_dropout_rate": hf["attention_dropout"], "model.dtype": "float32",
          "model.vocab_size": hf["vocab_size"]}
  if kind == NLLB_MOE:
    keys |= _moe_overrides(hf, where)
  return keys


def _moe_overrides(hf: dict, where: str) -> dict:
  steps = {hf["encoder_sparse_step"], hf["decoder_sparse_step"]}
  if len(steps) > 1 or min(steps) <= 0:
    raise UserError(f"{where}: encoder_sparse_step={hf['encoder_sparse_step']} and decoder_sparse_step="
                    f"{hf['decoder_sparse_step']}: this model needs one positive step for both (model.moe_interval)")
  if hf["second_expert_policy"] not in ("all", "random"):
    raise UserError(f"{where}: second_expert_policy={hf['second_expert_policy']!r} is not supported ('all', 'random')")
  if not hf["moe_eval_capacity_token_fraction"] > 0:
    raise UserError(f"{where}: moe_eval_capacity_token_fraction={hf['moe_eval_capacity_token_fraction']}: a fixed "
                    "evaluation capacity is not supported (a fraction > 0 is)")
  return {"model.moe_interval": steps.pop(), "moe.router": "gshard", "moe.num_experts": hf["num_experts"],
          "moe.hidden_dim": hf["encoder_ffn_dim"], "moe.expert_bias": True, "moe.min_capacity": 1,
          "moe.second_expert_policy": hf["second_expert_policy"], "moe.second_expert_threshold": 0.5,
          "moe.normalize_before_drops": hf["normalize_router_prob_before_dropping"],
          "moe.train_capacity": hf["expert_capacity"],
          "moe.eval_capacity_fraction": hf["moe_eval_capacity_token_fraction"],
          "moe.expert_dropout": hf["moe_token_dropout"], "moe.aux_loss_weight": hf["router_aux_loss_coef"],
          "moe.z_loss_weight": hf["router_z_loss_coef"]}


def _refuse(key: str, value, why: str):
  raise UserError(f"{key}={value!r}: {why}; transformers' M2M100 and NllbMoe cannot express it")


def _check_exportable(model, moe, ids) -> None:
  fixed = {"embedding": "vaswani", "positions": "sinusoidal", "share_embeddings": True,
           "layer_norm_epsilon": LAYER_NORM_EPSILON, "position_offset": ids.pad + 1}
  for key, value in fixed.items():
    if getattr(model, key) != value:
      _refuse(f"model.{key}", getattr(model, key), f"expected {value!r}")
  if model.num_heads * model.head_dim != model.emb_dim:
    _refuse("model.head_dim", model.head_dim, f"the heads must make up model.emb_dim={model.emb_dim}")
  if not model.moe_interval:
    return
  same = {"router": "gshard", "decoder_router": "", "shared_experts": 0, "balance": "aux_loss", "activation": "relu",
          "jitter_noise": 0.0, "router_logit_cap": 0.0}
  for key, value in same.items():
    if getattr(moe, key) != value:
      _refuse(f"moe.{key}", getattr(moe, key), f"expected {value!r}")
  if moe.hidden_dim != model.mlp_dim:
    _refuse("moe.hidden_dim", moe.hidden_dim, f"NllbMoe's experts are as wide as its dense FFNs ({model.mlp_dim})")


def hf_config(config, vocab_size: int, ids, bos: int, max_length: int) -> dict:
  """A run's config -> config.json of the HF class that computes the same; `ids` the tokenizer's special ids
  (pad, eos, start), `bos` its <s>, `max_length` the longest sequence it should embed."""
  model, moe = config.model, config.moe
  _check_exportable(model, moe, ids)
  kind = NLLB_MOE if model.moe_interval else M2M100
  out = {"model_type": kind, "architectures": [ARCHITECTURES[kind]], "vocab_size": vocab_size,
         "d_model": model.emb_dim, "max_position_embeddings": max(1024, max_length),
         "encoder_layers": model.num_encoder_layers, "decoder_layers": model.num_decoder_layers,
         "encoder_attention_heads": model.num_heads, "decoder_attention_heads": model.num_heads,
         "encoder_ffn_dim": model.mlp_dim, "decoder_ffn_dim": model.mlp_dim, "encoder_layerdrop": 0.0,
         "decoder_layerdrop": 0.0, "activation_function": "relu", "dropout": model.dropout_rate,
         "attention_dropout": model.attention_dropout_rate, "activation_dropout": 0.0, "init_std": 0.02,
         "scale_embedding": True, "use_cache": True, "is_encoder_decoder": True,
         "tie_word_embeddings": model.tied_logits, "pad_token_id": ids.pad, "eos_token_id": ids.eos,
         "bos_token_id": bos, "decoder_start_token_id": ids.start, "torch_dtype": "float32"}
  if kind == NLLB_MOE:
    out |= {"num_experts": moe.num_experts, "encoder_sparse_step": model.moe_interval,
            "decoder_sparse_step": model.moe_interval, "router_bias": False, "router_dtype": "float32",
            "router_ignore_padding_tokens": False, "expert_capacity": moe.train_capacity or gating.expert_capacity(
                moe.group_size, moe.num_experts, moe.train_capacity_factor, moe.min_capacity),
            # C = ceil(f * S) there, ceil(factor * 2 * S / E) here
            "moe_eval_capacity_token_fraction": (moe.eval_capacity_fraction
                                                 or moe.eval_capacity_factor * 2 / moe.num_experts),
            "moe_token_dropout": moe.expert_dropout,
            # 'all': NllbMoe draws its 'random' policy in evaluation too, where this model keeps every second choice
            "second_expert_policy": "all",
            "normalize_router_prob_before_dropping": moe.normalize_before_drops, "batch_prioritized_routing": False,
            "router_z_loss_coef": moe.z_loss_weight, "router_aux_loss_coef": moe.aux_loss_weight,
            "output_router_logits": False}
  return out


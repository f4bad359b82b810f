"""Which experts each language uses: teacher-forced passes over each language's pairs (the evaluation capacity, no
noise), counting per MoE layer the assignments of its real tokens to each expert, asked for and kept; and the
statistics of those counts, as pure functions. Letters: G groups, S tokens per group, K choices, E experts, N
languages.

The layer writes its routing to the 'routing' collection when that is mutable (`moe.layer.ROUTING`); one language
per batch, so every real token of a pass is that language's. "Asked": each real token's K choices (expert choice:
what each expert took, as its experts ask for nothing else); "kept": those capacity kept.
"""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from gshard_mt.config import row_lengths
from gshard_mt.data import pipeline
from gshard_mt.model.transformer import Transformer
from gshard_mt.moe import routers
from gshard_mt.moe.layer import ROUTING
from gshard_mt.moe.routers import ExpertChoice


def assignment_counts(expert_index: jax.Array, kept: jax.Array, mask: jax.Array, E: int) -> jax.Array:
  """expert_index int [..., G, S, K], kept bool [..., G, S, K], mask bool [..., G, S] (real tokens) -> int32
  [..., 2, E]: per expert, the real tokens' assignments asked for (row 0) and kept (row 1)."""
  onehot = jax.nn.one_hot(expert_index, E, dtype=jnp.int32)  # ...GSKE
  asked = onehot * mask[..., None, None]
  return jnp.stack([asked.sum((-4, -3, -2)), (asked * kept[..., None]).sum((-4, -3, -2))], axis=-2)


def layer_counts(collection: dict, E: int, expert_choice: dict[str, bool]) -> dict[str, jax.Array]:
  """The 'routing' collection of one apply -> {'encoder_0', ..., 'decoder_0', ...: int32 [2, E]}, the MoE layers
  of each stack in order (scanned: the units' axis; looped: unit_0, unit_1, ...). expert_choice[side]: that stack
  routes by expert choice (asked = kept)."""
  flat = traverse_util.flatten_dict(collection)
  out = {}
  for side in ("encoder", "decoder"):
    layers = sorted({p[:-1] for p in flat if p[0] == side}, key=lambda p: [int(n) for n in re.findall(r"\d+", p[1])])
    counts = [assignment_counts(*(flat[p + (name,)] for name in ("expert_index", "kept", "mask")), E).reshape(-1, 2, E)
              for p in layers]
    for u, c in enumerate(jnp.concatenate(counts) if counts else []):
      out[f"{side}_{u}"] = c.at[0].set(c[1]) if expert_choice[side] else c
  return out


def language_counts(run, split: str = "dev", max_pairs: int | None = None) -> dict[str, dict[str, np.ndarray]]:
  """{layer: {language: int64 [2, E]}} over (up to `max_pairs` of) each language's pairs of `split` that fit the
  training rows, `run` an `evaluate.Restored`; one language per batch of config.batch_size rows."""
  config, cfg = run.config, run.model_cfg
  E = cfg.moe.num_experts
  model = Transformer(cfg, deterministic=True)
  expert_choice = {side: issubclass(routers.router_class(cfg.moe, side == "decoder"), ExpertChoice)
                   for side in ("encoder", "decoder")}

  @jax.jit
  def count(params, batch):
    _, variables = model.apply({"params": params}, batch, mutable=[ROUTING])
    return layer_counts(variables[ROUTING], E, expert_choice)

  tokens = run.data.tokens[split]
  lengths = row_lengths(config)
  fits = pipeline.eligible(tokens, lengths).ids
  out = {}
  with nn.logical_axis_rules(()):  # as decoding: XLA places the work from the parameters' shardings
    for lang in tokens.languages:
      ids = fits[tokens.lang[fits] == tokens.languages.index(lang)][:max_pairs]
      for batch in pipeline.eval_batches(tokens, config.batch_size, lengths[0], ids, lengths[1]):
        batch.pop("index")
        for layer, c in jax.device_get(count(run.params, batch)).items():
          layer_out = out.setdefault(layer, {})
          layer_out[lang] = layer_out.get(lang, 0) + np.asarray(c, np.int64)
  return {layer: out[layer] for layer in sorted(out, key=lambda n: (n.startswith("decoder"), int(n.split("_")[1])))}


def shares(counts: np.ndarray) -> np.ndarray:
  """counts [N, E] -> each row's share of its assignments [N, E] (a row of zeros stays zero)."""
  counts = np.asarray(counts, np.float64)
  return counts / np.maximum(counts.sum(-1, keepdims=True), 1e-300)


def entropy(p: np.ndarray, axis: int = -1) -> np.ndarray:
  """Entropy in bits of distributions p along `axis`."""
  return -np.sum(np.where(p > 0, p * np.log2(np.where(p > 0, p, 1.0)), 0.0), axis=axis)


def normalized_mutual_information(counts: np.ndarray) -> float:
  """counts [N, E] (languages x experts) -> I(language; expert) / min(H(language), H(expert)), each language
  weighted equally (p(l) = 1/N, p(e|l) its share): 1 when the expert tells the language (each language has experts
  of its own) or the language tells the expert, 0 when every language spreads alike. Languages without
  assignments are left out; fewer than two: 0."""
  p = shares(np.asarray(counts)[np.asarray(counts).sum(-1) > 0])
  if len(p) < 2:
    return 0.0
  h_lang, h_expert = np.log2(len(p)), entropy(p.mean(0))
  mutual = h_expert - entropy(p).mean()
  return float(max(mutual, 0.0) / min(h_lang, h_expert)) if min(h_lang, h_expert) > 0 else 0.0


def experts_for_share(counts: np.ndarray, share: float) -> np.ndarray:
  """counts [..., E] -> int [...]: the fewest experts whose assignments reach `share` of the row's (0 for none)."""
  counts = np.asarray(counts, np.float64)
  top = np.cumsum(-np.sort(-counts, axis=-1), axis=-1)
  total = counts.sum(-1, keepdims=True)
  return np.where(total[..., 0] > 0, (top < share * total - 1e-9 * total).sum(-1) + 1, 0)


def experts_carrying(counts: np.ndarray, share: float) -> np.ndarray:
  """counts [E] -> the fewest experts (ascending ids) whose assignments reach `share` of all (ties: lower ids)."""
  order = np.argsort(-np.asarray(counts), kind="stable")
  return np.sort(order[: int(experts_for_share(counts, share))])


def js_distances(p: np.ndarray) -> np.ndarray:
  """p [N, D] (rows: distributions, or several layers' concatenated and each summing to 1 per layer) -> the
  Jensen-Shannon distances [N, N] (base 2, in [0, 1] per distribution; rows of several layers: the root of the
  mean divergence over them when p sums to the number of layers)."""
  layers = max(round(float(p[0].sum())), 1) if len(p) else 1
  m = (p[:, None] + p[None]) / 2
  kl = lambda a, b: np.where(a > 0, a * np.log2(np.maximum(a, 1e-300) / np.maximum(b, 1e-300)), 0.0)  # noqa: E731
  divergence = (kl(p[:, None], m) + kl(p[None], m)).sum(-1) / 2 / layers
  return np.sqrt(np.clip(divergence, 0.0, 1.0))

"""The GShard encoder-decoder Transformer: pre-LN layers, a MoE FFN in place of every `moe_interval`-th FFN.

Letters: B batch (rows), L positions (Ls on the source side), M model dim, V vocabulary, U layer units (others in
`layers`). Units of `moe_interval` layers, the last one MoE, are stacked with `nn.scan` (compile time does not grow
with depth). Packed rows: segment ids (attention within a pair) and per-pair positions.
"""

from __future__ import annotations

import dataclasses
import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from gshard_mt.batch import BATCH_KEYS
from gshard_mt.config import platforms
from gshard_mt.config.moe import MoeConfig
from gshard_mt.config.sections import ModelConfig
from gshard_mt.errors import ConfigError
from gshard_mt.model import layers
from gshard_mt.model.layers import Attention, DenseFFN, layer_norm, packing_mask, shift_right, sinusoidal, source_bias
from gshard_mt.moe import balance, routers
from gshard_mt.moe.layer import ROUTING, MoeFeedForward
from gshard_mt.ops import Ops
from gshard_mt.parallel.einsum import weight_einsum
from gshard_mt.registry import Registry

log = logging.getLogger(__name__)

BLM = ("batch", "length", "embed")
# Embedding schemes: (initial std, input multiplier, tied-logits multiplier), each as a power of M. Both real
# schemes give the residual stream unit-variance token embeddings and unit-variance logits at initialisation, so
# the first loss is ln V; they differ in how large Adam's steps are relative to the embedding (sections 3.2 and
# 3.4 of Vaswani et al. 2017 give the second).
EMBEDDING_SCHEMES = Registry("model.embedding").add({
    "t5": (0.0, 0.0, -0.5),  # T5 and Flax's examples/wmt: std 1, logits scaled down
    "vaswani": (-0.5, 0.5, 0.0),  # Vaswani et al., tensor2tensor, fairseq: std M^-0.5, inputs scaled up
    # Mixtures, for the comparison in docs/decisions.md: inputs sqrt(M) too large, logits sqrt(M) too small.
    "sqrt_input": (0.0, 0.5, -0.5),
    "small_logits": (-0.5, 0.5, -0.5),
})
# model.remat: what a layer unit keeps for the backward pass, recomputing the rest.
REMAT_POLICIES = Registry("model.remat").add({
    "none": None,  # no rematerialisation: everything is kept
    "full": jax.checkpoint_policies.nothing_saveable,  # only the unit's input: the forward pass runs twice
    "dots": jax.checkpoint_policies.checkpoint_dots,  # every matmul's output; activations, softmax, ... recomputed
    # the dense projections' outputs; attention scores and expert matmuls (batched) recomputed: MaxText's 'minimal'
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
})


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig:
  """What the model reads (hashable): the config's `model` and `moe` sections themselves, every `auto` resolved and
  `model.vocab_size` the embedding's rows, and what the run adds: the decoder's start id and the kernels it picked
  (`ops`). `reference` makes one on the float32 reference paths (tests, benchmarks)."""

  model: ModelConfig
  moe: MoeConfig = MoeConfig(dispatch=platforms.REFERENCE["moe.dispatch"])
  start_id: int = 0  # the decoder's first input at each pair's start: the tokenizer's SpecialIds.start
  ops: Ops = Ops()  # the optional kernels, picked by the training setup (none: XLA's reference paths)

  @classmethod
  def from_config(cls, config, vocab_size: int, platform: str | None = None) -> TransformerConfig:
    """From a config's `model` and `moe` sections, each `auto` option resolved for `platform` (the devices'
    `jax.Device.platform`; None: JAX's default backend) by `platforms.resolve` (what each became is logged), and
    `model.vocab_size` 0 replaced by the tokenizer's `vocab_size`."""
    platform = platform or jax.default_backend()
    config, chosen = platforms.resolve(config, platform)
    if chosen:
      log.info("auto options on %s: %s", platform, ", ".join(f"{k}={v}" for k, v in chosen.items()))
    rows = config.model.vocab_size
    if rows and rows < vocab_size:
      raise ConfigError(f"model.vocab_size={rows} is smaller than the tokenizer's {vocab_size} ids")
    return cls(model=dataclasses.replace(config.model, vocab_size=rows or vocab_size), moe=config.moe)

  @classmethod
  def reference(cls, moe: MoeConfig | None = None, **model) -> TransformerConfig:
    """The model section of `model`'s keys (the rest at their defaults) on the float32 reference paths."""
    paths = {key.removeprefix("model."): v for key, v in platforms.REFERENCE.items() if key.startswith("model.")}
    return cls(model=ModelConfig(**{"dtype": "float32", **paths, **model}), **{"moe": moe} if moe else {})

  @property
  def dtype(self) -> jnp.dtype:
    return jnp.dtype(self.model.dtype)

  @property
  def residual_dtype(self) -> jnp.dtype:  # the stream the layers add to (layer norms compute in float32)
    return jnp.dtype(self.model.residual_dtype)

  @property
  def unit_size(self) -> int:
    """Layers per scanned unit: `moe_interval` (the last one MoE), or 1 for a dense model."""
    return max(self.model.moe_interval, 1)


@struct.dataclass
class LayerInputs:
  """What every layer of a stack sees besides x (broadcast to all scanned units)."""

  # [B, 1, L, L] (layers.packing_mask; an attention kernel: the segment ids), or [B, 1, R, L*R] over the beam slots
  self_bias: jax.Array | tuple
  token_mask: jax.Array  # [B, L], True for real tokens (MoE routing skips the others)
  memory: jax.Array | None = None  # [B, Ls, M] encoder output (decoder only; None for later decoding steps)
  cross_bias: jax.Array | tuple | None = None  # [B, 1, L, Ls] (as self_bias), or [B, 1, 1, Ls] per sentence decoding
  decode_step: jax.Array | None = None  # the position being decoded
  language: jax.Array | None = None  # [B, L, M] the router input of moe.router='language' (`source_tags`)


class Layer(nn.Module):
  """One pre-LN layer: self-attention, [cross-attention,] then a dense or MoE FFN, each with a residual."""

  cfg: TransformerConfig
  is_decoder: bool
  use_moe: bool
  decode: bool = False

  @nn.compact
  def __call__(self, x, inputs: LayerInputs, *, deterministic: bool):
    """x [B, L, M] -> (x [B, L, M], MoE stats or {})."""
    cfg, m = self.cfg, self.cfg.model
    drop = nn.Dropout(m.dropout_rate)
    attention = dict(num_heads=m.num_heads, head_dim=m.head_dim, dtype=cfg.dtype, decode=self.decode,
                     dropout_rate=m.attention_dropout_rate, attention=m.attention, kernel=cfg.ops.attention,
                     use_bias=m.bias, epsilon=m.layer_norm_epsilon)
    norm = lambda name: layers.NormParams(x.shape[-1], name=name)()  # noqa: E731  applied by Attention
    h = Attention(**attention, causal=self.is_decoder, name="self_attention")(
        x, None, inputs.self_bias, norm=norm("pre_self_attention"), deterministic=deterministic,
        decode_step=inputs.decode_step)
    x = x + drop(h, deterministic=deterministic).astype(x.dtype)
    if self.is_decoder:
      h = Attention(**attention, is_cross=True, name="cross_attention")(
          x, inputs.memory, inputs.cross_bias, norm=norm("pre_cross_attention"), deterministic=deterministic)
      x = x + drop(h, deterministic=deterministic).astype(x.dtype)
    h = layer_norm("pre_ffn", m.layer_norm_epsilon)(x)
    stats = {}
    if self.use_moe:
      moe = MoeFeedForward(cfg.moe, dtype=cfg.dtype, decoder=self.is_decoder, ops=cfg.ops, name="moe")
      h, stats = moe(h, inputs.token_mask, deterministic=deterministic, language=inputs.language)
    else:
      h = DenseFFN(m.mlp_dim, cfg.dtype, m.dropout_rate, m.bias, name="ffn")(h, deterministic=deterministic)
    x = x + drop(h, deterministic=deterministic).astype(x.dtype)
    return nn.with_logical_constraint(x, BLM), stats


class Unit(nn.Module):
  """`unit_size` layers, the last one MoE unless the model is dense; the body of the layer scan."""

  cfg: TransformerConfig
  is_decoder: bool
  deterministic: bool
  decode: bool = False

  @nn.compact
  def __call__(self, x, inputs: LayerInputs):
    """x [B, L, M] -> (x [B, L, M], the unit's MoE stats)."""
    n = self.cfg.unit_size
    stats = {}
    for i in range(n):
      use_moe = self.cfg.model.moe_interval > 0 and i == n - 1
      x, s = Layer(self.cfg, self.is_decoder, use_moe, self.decode, name=f"layer_{i}")(
          x, inputs, deterministic=self.deterministic)
      stats = s or stats
    return x, stats


class Stack(Unit):
  """The encoder or decoder: `num_layers / unit_size` Units, scanned (or looped), then a final layer norm."""

  num_layers: int = 0

  @nn.compact
  def __call__(self, x, inputs: LayerInputs):
    """x [B, L, M] -> (x [B, L, M], MoE stats stacked over the units [U, ...])."""
    cfg, m = self.cfg, self.cfg.model
    num_units = self.num_layers // cfg.unit_size
    unit = Unit if m.remat == "none" else nn.remat(Unit, static_argnums=(), policy=REMAT_POLICIES[m.remat])
    if m.scan_layers:
      scanned = nn.scan(unit, variable_axes={"params": 0, "cache": 0, "memory": 0, balance.COLLECTION: 0,
                                             ROUTING: 0},
                        split_rngs={"params": True, "dropout": True, "gating": True},
                        in_axes=(nn.broadcast,), length=num_units, unroll=max(1, min(m.scan_unroll, num_units)),
                        metadata_params={nn.PARTITION_NAME: "layers"})
      x, stats = scanned(cfg, self.is_decoder, self.deterministic, self.decode, name="units")(x, inputs)
    else:
      per_unit = []
      for u in range(num_units):
        x, s = unit(cfg, self.is_decoder, self.deterministic, self.decode, name=f"unit_{u}")(x, inputs)
        per_unit.append(s)
      stats = jax.tree.map(lambda *s: jnp.stack(s), *per_unit) if per_unit and per_unit[0] else {}
    return layer_norm("final_norm", m.layer_norm_epsilon)(x), stats


class Transformer(nn.Module):
  """Encoder-decoder translation model. `__call__(batch)` -> (logits [B, L, V] in cfg.dtype, MoE stats)."""

  cfg: TransformerConfig
  deterministic: bool = True
  decode: bool = False

  def setup(self):
    """Embeddings (token [V, M], optional learned positions), the untied logits [M, V], the two stacks."""
    cfg, m = self.cfg, self.cfg.model
    embed_init = nn.with_logical_partitioning(nn.initializers.normal(self._scales[0]), ("vocab", "embed"))
    self.src_embed = nn.Embed(m.vocab_size, m.emb_dim, embedding_init=embed_init, name="embed")
    self.tgt_embed = self.src_embed if m.share_embeddings else nn.Embed(
        m.vocab_size, m.emb_dim, embedding_init=embed_init, name="target_embed")
    if not m.tied_logits:
      self.logits_kernel = self.param("logits", nn.with_logical_partitioning(
          nn.initializers.lecun_normal(), ("embed", "vocab")), (m.emb_dim, m.vocab_size))
    if m.positions == "learned":
      self.position_table = self.param("positions", nn.with_logical_partitioning(
          nn.initializers.normal(0.02), (None, "embed")), (m.max_position, m.emb_dim))
    self.encoder = Stack(cfg, False, self.deterministic, num_layers=m.num_encoder_layers, name="encoder")
    self.decoder = Stack(cfg, True, self.deterministic, self.decode, num_layers=m.num_decoder_layers,
                         name="decoder")
    self.dropout = nn.Dropout(m.dropout_rate)

  @property
  def _scales(self) -> tuple[float, float, float]:
    """(initial embedding std, input multiplier, tied-logits multiplier) of `cfg.model.embedding`."""
    return tuple(self.cfg.model.emb_dim ** e for e in EMBEDDING_SCHEMES[self.cfg.model.embedding])

  def _embed(self, table, tokens, positions):
    m = self.cfg.model
    x = table(tokens) * self._scales[1]
    positions = positions + m.position_offset
    if m.positions == "learned":
      x = x + jnp.take(self.position_table, positions, axis=0)
    else:
      x = x + sinusoidal(positions, m.emb_dim)
    x = x.astype(self.cfg.residual_dtype)
    return nn.with_logical_constraint(self.dropout(x, deterministic=self.deterministic), BLM)

  def _language(self, src_tokens, src_segments, segments, decoder: bool, beams: bool = False):
    """What moe.router='language' reads for each token of `segments` [B', L]: the embedding of its pair's source
    tag (times the input multiplier, as a token's), or None where the stack routes by token."""
    if not self.cfg.model.moe_interval or not routers.router_class(self.cfg.moe, decoder).reads_language:
      return None
    if src_tokens is None:
      raise ValueError("moe.router='language' routes by the source language: decode_logits needs src_tokens")
    return self.src_embed(layers.source_tags(src_tokens, src_segments, segments, beams)) * self._scales[1]

  @property
  def _attention_masks(self) -> tuple[str, bool]:
    """(model.attention, whether a kernel reads segment ids): how `packing_mask` gives the attention its mask."""
    return self.cfg.model.attention, self.cfg.ops.attention is not None

  def encode(self, inputs, segments, positions):
    """[B, Ls] tokens -> (memory [B, Ls, M], stats)."""
    x = self._embed(self.src_embed, inputs, positions)
    self_bias = packing_mask(segments, segments, False, *self._attention_masks)
    return self.encoder(x, LayerInputs(self_bias, segments > 0,
                                       language=self._language(inputs, segments, segments, decoder=False)))

  def decode_logits(self, memory, src_segments, decoder_inputs, segments, positions, decode_step=None,
                    self_bias=None, src_tokens=None):
    """Decoder over [B, L] inputs (or one step of them when decoding) -> (logits [B, L, V] in cfg.dtype, stats).
    A decoding step takes the self-attention bias over the cache (`decode.beam_bias`); moe.router='language'
    needs the source tokens [B, Ls] (their tags)."""
    x = self._embed(self.tgt_embed, decoder_inputs, positions)
    # While decoding, N = B x beams rows attend to the B sentences' sources, and self_bias masks the cache.
    if self.decode:
      cross_bias = source_bias(src_segments)
    else:
      cross_bias = packing_mask(segments, src_segments, False, *self._attention_masks)
    if self_bias is None:
      self_bias = packing_mask(segments, segments, True, *self._attention_masks)
    language = self._language(src_tokens, src_segments, segments, decoder=True, beams=self.decode)
    y, stats = self.decoder(x, LayerInputs(self_bias, segments > 0, memory, cross_bias, decode_step, language))
    tied = self.cfg.model.tied_logits
    kernel = self.tgt_embed.embedding.T * self._scales[2] if tied else self.logits_kernel  # [M, V]
    # In the computation dtype, as every other matmul: float32 [B, L, V] logits would be the largest tensor of a
    # bfloat16 step, and the loss reads them in float32 anyway (training.step.cross_entropy).
    logits = weight_einsum("BLM,MV->BLV", y.astype(self.cfg.dtype), kernel)
    return nn.with_logical_constraint(logits, ("batch", "length", "vocab")), stats

  def __call__(self, batch):
    memory, enc_stats = self.encode(batch["inputs"], batch["inputs_segmentation"], batch["inputs_position"])
    decoder_inputs = shift_right(batch["targets"], batch["targets_segmentation"], self.cfg.start_id)
    logits, dec_stats = self.decode_logits(memory, batch["inputs_segmentation"], decoder_inputs,
                                           batch["targets_segmentation"], batch["targets_position"],
                                           src_tokens=batch["inputs"])
    return logits, {"encoder": enc_stats, "decoder": dec_stats}


def dummy_batch(batch_size: int, length: int) -> dict:
  """An all-ones batch (positions 0, 1, ...) of the right shapes and dtypes, for initialisation and shapes."""
  ones = jnp.ones((batch_size, length), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch_size, length))
  return {key: positions if key.endswith("_position") else ones for key in BATCH_KEYS}

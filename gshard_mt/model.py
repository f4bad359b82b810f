"""The GShard encoder-decoder Transformer: pre-LN layers, a MoE FFN in place of every `moe_interval`-th FFN.

Letters: B batch, Q query positions, K key positions, A attention heads, D head dim, M model dim, F dense FFN
hidden, V vocabulary. Layers come in units of `moe_interval` layers whose last one is MoE (one dense layer when
the model is dense); the units are stacked with `nn.scan`, so compile time does not grow with depth.
Packed rows are handled by segment ids (attention only within a pair) and per-pair positions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from gshard_mt.moe import MoeFeedForward

BLM = ("batch", "length", "embed")
# Embedding schemes: (initial std, input multiplier, tied-logits multiplier), each as a power of M. Both real
# schemes give the residual stream unit-variance token embeddings and unit-variance logits at initialisation, so
# the first loss is ln V; they differ in how large Adam's steps are relative to the embedding (sections 3.2 and
# 3.4 of Vaswani et al. 2017 give the second).
EMBEDDING_SCHEMES = {
    "t5": (0.0, 0.0, -0.5),  # T5 and Flax's examples/wmt: std 1, logits scaled down
    "vaswani": (-0.5, 0.5, 0.0),  # Vaswani et al., tensor2tensor, fairseq: std M^-0.5, inputs scaled up
    # Mixtures of the two, kept to reproduce the comparison in bench/RESULTS.md: inputs sqrt(M) times too large
    # (initial loss grows with M), and logits sqrt(M) times too small (slow start).
    "sqrt_input": (0.0, 0.5, -0.5),
    "small_logits": (-0.5, 0.5, -0.5),
}
NEG_INF = -1e10  # additive mask: exp(NEG_INF - max) is exactly 0 in float32 and bfloat16


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """The model's hyper-parameters (hashable, so modules can hold it)."""

  vocab_size: int
  emb_dim: int = 512
  num_heads: int = 8
  head_dim: int = 64
  mlp_dim: int = 2048
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  moe_interval: int = 2
  share_embeddings: bool = True
  tied_logits: bool = False
  embedding: str = "vaswani"  # a key of EMBEDDING_SCHEMES
  positions: str = "sinusoidal"
  max_position: int = 512
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  remat: bool = False
  scan_layers: bool = True
  moe: dict = dataclasses.field(default_factory=dict)  # MoeFeedForward keyword arguments

  @classmethod
  def from_config(cls, config, vocab_size: int) -> "TransformerConfig":
    m = config.model
    moe = dict(num_experts=config.moe.num_experts, hidden_dim=config.moe.hidden_dim,
               group_size=config.moe.group_size, train_capacity_factor=config.moe.train_capacity_factor,
               eval_capacity_factor=config.moe.eval_capacity_factor, min_capacity=config.moe.min_capacity,
               second_expert_policy=config.moe.second_expert_policy,
               second_expert_threshold=config.moe.second_expert_threshold, dispatch=config.moe.dispatch,
               activation=config.moe.activation, jitter_noise=config.moe.jitter_noise,
               router_logit_cap=config.moe.router_logit_cap)
    return cls(vocab_size=vocab_size, emb_dim=m.emb_dim, num_heads=m.num_heads, head_dim=m.head_dim,
               mlp_dim=m.mlp_dim, num_encoder_layers=m.num_encoder_layers, num_decoder_layers=m.num_decoder_layers,
               moe_interval=m.moe_interval, share_embeddings=m.share_embeddings, tied_logits=m.tied_logits,
               embedding=m.embedding,
               positions=m.positions,
               max_position=m.max_position, dropout_rate=m.dropout_rate,
               attention_dropout_rate=m.attention_dropout_rate, dtype=jnp.dtype(m.dtype), remat=m.remat,
               scan_layers=m.scan_layers, moe=tuple(sorted(moe.items())))

  @property
  def unit_size(self) -> int:
    return max(self.moe_interval, 1)


def sinusoidal(positions: jax.Array, dim: int) -> jax.Array:
  """[B, L] integer positions -> [B, L, dim] sinusoidal encodings (sin on the first half, cos on the second)."""
  half = dim // 2
  freq = np.exp(-np.log(10_000.0) * np.arange(half) / max(half - 1, 1))
  angle = positions[..., None].astype(jnp.float32) * freq
  return jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)


def attention_bias(q_segments, k_segments, causal: bool, dtype=jnp.float32) -> jax.Array:
  """[B, Q], [B, K] segment ids (0 = padding) -> [B, 1, Q, K] additive bias: 0 where allowed, NEG_INF elsewhere."""
  allowed = (q_segments[:, :, None] == k_segments[:, None, :]) & (k_segments[:, None, :] > 0)
  if causal:
    allowed &= jnp.tril(jnp.ones((q_segments.shape[1], k_segments.shape[1]), bool))
  return jnp.where(allowed, 0.0, NEG_INF).astype(dtype)[:, None]


def shift_right(targets: jax.Array, segments: jax.Array) -> jax.Array:
  """Decoder inputs: targets moved one step right, with 0 (PAD as BOS) at each packed pair's start."""
  shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  prev_segments = jnp.pad(segments, ((0, 0), (1, 0)))[:, :-1]
  return jnp.where(segments == prev_segments, shifted, 0)


def _param(module, name, shape, names, init=nn.initializers.lecun_normal()):
  return module.param(name, nn.with_logical_partitioning(init, names), shape, jnp.float32)


def _layer_norm(name):
  return nn.LayerNorm(name=name, scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))


class Attention(nn.Module):
  """Multi-head attention. While decoding (decode=True) self-attention caches its keys and values step by step,
  and cross-attention computes the source's keys and values once per sentence (the `memory` collection): the
  beams of a sentence share them, so its K beams are attended to as K query positions of one sentence."""

  cfg: TransformerConfig
  is_cross: bool = False
  decode: bool = False

  @nn.compact
  def __call__(self, x, kv, bias, deterministic: bool, decode_step=None):
    cfg, A, D, M = self.cfg, self.cfg.num_heads, self.cfg.head_dim, x.shape[-1]
    init = nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=0, out_axis=(1, 2))
    wq, wk, wv = (_param(self, n, (M, A, D), ("embed", "heads", "kv"), init) for n in ("query", "key", "value"))
    wo = _param(self, "out", (A, D, M), ("heads", "kv", "embed"),
                nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=(0, 1), out_axis=2))
    dt = cfg.dtype
    q = jnp.einsum("BQM,MAD->BQAD", x.astype(dt), wq.astype(dt)) * D ** -0.5
    project = lambda w: jnp.einsum("BKM,MAD->BKAD", kv.astype(dt), w.astype(dt))  # noqa: E731
    if self.decode and self.is_cross:
      k = self.variable("memory", "key", project, wk).value
      v = self.variable("memory", "value", project, wv).value
      return jnp.einsum("BQAD,ADM->BQM", self._attend_per_sentence(q, k, v, bias, deterministic), wo.astype(dt))
    k, v = project(wk), project(wv)
    if self.decode:
      k, v, bias = self._update_cache(k, v, bias, decode_step)
    out = self._attend(q, k, v, bias, deterministic)
    return jnp.einsum("BQAD,ADM->BQM", out, wo.astype(dt))

  def _attend(self, q, k, v, bias, deterministic):
    """q [B, Q, A, D], k and v [B, K, A, D], bias broadcastable to [B, A, Q, K] -> [B, Q, A, D]."""
    logits = jnp.einsum("BQAD,BKAD->BAQK", q, k).astype(jnp.float32) + bias
    probs = nn.Dropout(self.cfg.attention_dropout_rate)(jax.nn.softmax(logits, axis=-1), deterministic=deterministic)
    return jnp.einsum("BAQK,BKAD->BQAD", probs.astype(self.cfg.dtype), v)

  def _attend_per_sentence(self, q, k, v, bias, deterministic):
    """q [N, Q, A, D] for N = B x beams rows (beams of a sentence adjacent), k and v [B, K, A, D] of the B
    sentences, bias [B, 1, 1, K] -> [N, Q, A, D]."""
    N, Q, A, D = q.shape
    B = k.shape[0]
    out = self._attend(q.reshape(B, N // B * Q, A, D), k, v, bias, deterministic)
    return out.reshape(N, Q, A, D)

  def _update_cache(self, k, v, bias, step):
    """Writes one step's k, v at `step` of a [B, max_len, A, D] cache; returns the cache and a bias that hides
    its future. The cache is created by an init call with the full-length shape."""
    is_new = not self.has_variable("cache", "key")
    ck = self.variable("cache", "key", jnp.zeros, k.shape, k.dtype)
    cv = self.variable("cache", "value", jnp.zeros, v.shape, v.dtype)
    if is_new:
      return k, v, bias
    ck.value = jax.lax.dynamic_update_slice_in_dim(ck.value, k, step, axis=1)
    cv.value = jax.lax.dynamic_update_slice_in_dim(cv.value, v, step, axis=1)
    seen = jnp.arange(ck.value.shape[1]) <= step
    return ck.value, cv.value, jnp.where(seen, 0.0, NEG_INF)[None, None, None, :]


class DenseFFN(nn.Module):
  cfg: TransformerConfig

  @nn.compact
  def __call__(self, x, deterministic: bool):
    M, F, dt = x.shape[-1], self.cfg.mlp_dim, self.cfg.dtype
    wi = _param(self, "wi", (M, F), ("embed", "mlp"))
    wo = _param(self, "wo", (F, M), ("mlp", "embed"))
    h = jax.nn.relu(jnp.einsum("BLM,MF->BLF", x.astype(dt), wi.astype(dt)))
    h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
    h = nn.Dropout(self.cfg.dropout_rate)(h, deterministic=deterministic)
    return jnp.einsum("BLF,FM->BLM", h, wo.astype(dt))


class Layer(nn.Module):
  """One pre-LN layer: self-attention, [cross-attention,] then a dense or MoE FFN, each with a residual."""

  cfg: TransformerConfig
  is_decoder: bool
  use_moe: bool
  decode: bool = False

  @nn.compact
  def __call__(self, x, self_bias, memory, cross_bias, token_mask, deterministic, decode_step):
    drop = nn.Dropout(self.cfg.dropout_rate)
    h = _layer_norm("pre_self_attention")(x)
    h = Attention(self.cfg, decode=self.decode, name="self_attention")(
        h, h, self_bias, deterministic, decode_step)
    x = x + drop(h, deterministic=deterministic).astype(x.dtype)
    if self.is_decoder:
      h = _layer_norm("pre_cross_attention")(x)
      h = Attention(self.cfg, is_cross=True, decode=self.decode, name="cross_attention")(
          h, memory, cross_bias, deterministic)
      x = x + drop(h, deterministic=deterministic).astype(x.dtype)
    h = _layer_norm("pre_ffn")(x)
    stats = {}
    if self.use_moe:
      h, stats = MoeFeedForward(**dict(self.cfg.moe), dtype=self.cfg.dtype, name="moe")(
          h, token_mask, deterministic=deterministic)
    else:
      h = DenseFFN(self.cfg, name="ffn")(h, deterministic)
    x = x + drop(h, deterministic=deterministic).astype(x.dtype)
    return nn.with_logical_constraint(x, BLM), stats


class Unit(nn.Module):
  """`unit_size` layers, the last one MoE unless the model is dense; the body of the layer scan."""

  cfg: TransformerConfig
  is_decoder: bool
  deterministic: bool
  decode: bool = False

  @nn.compact
  def __call__(self, x, self_bias, memory, cross_bias, token_mask, decode_step):
    n = self.cfg.unit_size
    stats = {}
    for i in range(n):
      use_moe = self.cfg.moe_interval > 0 and i == n - 1
      x, s = Layer(self.cfg, self.is_decoder, use_moe, self.decode, name=f"layer_{i}")(
          x, self_bias, memory, cross_bias, token_mask, self.deterministic, decode_step)
      stats = s or stats
    return x, stats


class Stack(nn.Module):
  """The encoder or decoder layers: scanned units (or a loop), then a final layer norm."""

  cfg: TransformerConfig
  num_layers: int
  is_decoder: bool
  deterministic: bool
  decode: bool = False

  @nn.compact
  def __call__(self, x, self_bias, memory=None, cross_bias=None, token_mask=None, decode_step=None):
    cfg = self.cfg
    num_units = self.num_layers // cfg.unit_size
    unit = nn.remat(Unit, static_argnums=()) if cfg.remat else Unit
    args = (x, self_bias, memory, cross_bias, token_mask, decode_step)
    if cfg.scan_layers:
      scanned = nn.scan(unit, variable_axes={"params": 0, "cache": 0, "memory": 0},
                        split_rngs={"params": True, "dropout": True, "gating": True},
                        in_axes=(nn.broadcast,) * 5, length=num_units,
                        metadata_params={nn.PARTITION_NAME: "layers"})
      x, stats = scanned(cfg, self.is_decoder, self.deterministic, self.decode, name="units")(*args)
    else:
      per_unit = []
      for u in range(num_units):
        x, s = unit(cfg, self.is_decoder, self.deterministic, self.decode, name=f"unit_{u}")(x, *args[1:])
        per_unit.append(s)
      stats = jax.tree.map(lambda *s: jnp.stack(s), *per_unit) if per_unit and per_unit[0] else {}
    return _layer_norm("final_norm")(x), stats


class Transformer(nn.Module):
  """Encoder-decoder translation model. `__call__(batch)` -> (logits [B, L, V] float32, MoE stats)."""

  cfg: TransformerConfig
  deterministic: bool = True
  decode: bool = False

  def setup(self):
    cfg = self.cfg
    embed_init = nn.with_logical_partitioning(nn.initializers.normal(self._scales[0]), ("vocab", "embed"))
    self.src_embed = nn.Embed(cfg.vocab_size, cfg.emb_dim, embedding_init=embed_init, name="embed")
    self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embed(
        cfg.vocab_size, cfg.emb_dim, embedding_init=embed_init, name="target_embed")
    if not cfg.tied_logits:
      self.logits_kernel = self.param("logits", nn.with_logical_partitioning(
          nn.initializers.lecun_normal(), ("embed", "vocab")), (cfg.emb_dim, cfg.vocab_size))
    if cfg.positions == "learned":
      self.position_table = self.param("positions", nn.with_logical_partitioning(
          nn.initializers.normal(0.02), (None, "embed")), (cfg.max_position, cfg.emb_dim))
    self.encoder = Stack(cfg, cfg.num_encoder_layers, False, self.deterministic, name="encoder")
    self.decoder = Stack(cfg, cfg.num_decoder_layers, True, self.deterministic, self.decode, name="decoder")
    self.dropout = nn.Dropout(cfg.dropout_rate)

  @property
  def _scales(self) -> tuple[float, float, float]:
    """(initial embedding std, input multiplier, tied-logits multiplier) of `cfg.embedding`."""
    return tuple(self.cfg.emb_dim ** e for e in EMBEDDING_SCHEMES[self.cfg.embedding])

  def _embed(self, table, tokens, positions):
    x = table(tokens) * self._scales[1]
    if self.cfg.positions == "learned":
      x = x + jnp.take(self.position_table, positions, axis=0)
    else:
      x = x + sinusoidal(positions, self.cfg.emb_dim)
    return nn.with_logical_constraint(self.dropout(x, deterministic=self.deterministic), BLM)

  def encode(self, inputs, segments, positions):
    """[B, Lsrc] tokens -> (memory [B, Lsrc, M], stats)."""
    x = self._embed(self.src_embed, inputs, positions)
    return self.encoder(x, attention_bias(segments, segments, causal=False), token_mask=segments > 0)

  def decode_logits(self, memory, src_segments, decoder_inputs, segments, positions, decode_step=None):
    """Decoder over [B, L] inputs (or one step of them when decoding) -> (logits [B, L, V] float32, stats)."""
    x = self._embed(self.tgt_embed, decoder_inputs, positions)
    self_bias = attention_bias(segments, segments, causal=True)  # decoding steps mask by the cache instead
    if self.decode:  # N = B x beams rows attend to the B sentences' keys; all N rows are real
      cross_bias = jnp.where(src_segments > 0, 0.0, NEG_INF)[:, None, None, :]
    else:
      cross_bias = attention_bias(segments, src_segments, causal=False)
    y, stats = self.decoder(x, self_bias, memory, cross_bias, segments > 0, decode_step)
    if self.cfg.tied_logits:
      logits = self.tgt_embed.attend(y.astype(jnp.float32)) * self._scales[2]
    else:
      logits = jnp.einsum("BLM,MV->BLV", y.astype(jnp.float32), self.logits_kernel)
    return nn.with_logical_constraint(logits, ("batch", "length", "vocab")), stats

  def __call__(self, batch):
    memory, enc_stats = self.encode(batch["inputs"], batch["inputs_segmentation"], batch["inputs_position"])
    decoder_inputs = shift_right(batch["targets"], batch["targets_segmentation"])
    logits, dec_stats = self.decode_logits(memory, batch["inputs_segmentation"], decoder_inputs,
                                           batch["targets_segmentation"], batch["targets_position"])
    return logits, {"encoder": enc_stats, "decoder": dec_stats}


def dummy_batch(batch_size: int, length: int) -> dict:
  """An all-ones batch of the right shapes and dtypes, for initialisation and shape evaluation."""
  ones = jnp.ones((batch_size, length), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch_size, length))
  return {"inputs": ones, "targets": ones, "inputs_segmentation": ones, "targets_segmentation": ones,
          "inputs_position": positions, "targets_position": positions}


def count_params(config, vocab_size: int | None = None) -> int:
  """Parameters of the model a config describes, from shapes alone (nothing is allocated)."""
  cfg = TransformerConfig.from_config(config, vocab_size or config.data.vocab_size)
  shapes = jax.eval_shape(lambda: Transformer(cfg).init(jax.random.key(0), dummy_batch(1, 8)))
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(shapes)))

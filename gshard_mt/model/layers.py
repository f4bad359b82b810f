"""The Transformer's building blocks: pure attention math, and the attention and dense FFN modules.

Letters: B batch (rows), Q query positions, K key positions, A heads, D head dim, M model dim, F dense FFN hidden.
Parameters carry logical axes ('embed', 'heads', 'kv', 'mlp') for `gshard_mt.parallel.rules`. Training attends by
model.attention (ATTENTIONS; only 'xla' has attention dropout), or by the attention kernel the run's `Ops` holds;
decoding always by the cached einsums.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from gshard_mt.parallel.einsum import weight_einsum
from gshard_mt.registry import Registry

NEG_INF = -1e10  # additive mask: exp(NEG_INF - max) is exactly 0 in float32 and bfloat16
LAYER_NORM_EPSILON = 1e-6  # flax's default
NORM_INITS = {"scale": nn.initializers.ones, "bias": nn.initializers.zeros}  # a layer norm's parameters
# model.dropout_rng: the dropout masks' key from the step's threefry key. 'rbg' (XLA's RngBitGenerator, bits
# depending on backend and XLA version) is fused Philox on GPUs; not the default: it saved nothing measurable on one
# GPU and, split over several devices, draws the whole batch's bits on each (docs/decisions.md).
DROPOUT_KEYS = Registry("model.dropout_rng").add({
    "threefry": lambda key: key,
    "rbg": lambda key: jax.random.wrap_key_data(jax.random.bits(key, (4,), jnp.uint32), impl="rbg"),
})
ATTENTIONS = Registry("model.attention").add({  # model.attention: the paths of `Attention` (or a kernel's)
    "xla": "einsums with an additive mask (the reference; attention dropout)",
    "fused": "jax.nn.dot_product_attention with a boolean mask: cuDNN's flash attention on GPUs",
})


def sinusoidal(positions: jax.Array, dim: int) -> jax.Array:
  """[B, L] integer positions -> [B, L, dim] sinusoidal encodings (sin on the first half, cos on the second)."""
  half = dim // 2
  freq = np.exp(-np.log(10_000.0) * np.arange(half) / max(half - 1, 1))
  angle = positions[..., None].astype(jnp.float32) * freq
  return jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)


def attention_mask(q_segments: jax.Array, k_segments: jax.Array, causal: bool) -> jax.Array:
  """[B, Q], [B, K] segment ids (0 = padding) -> [B, 1, Q, K] bool: True where a query may attend to a key."""
  allowed = (q_segments[:, :, None] == k_segments[:, None, :]) & (k_segments[:, None, :] > 0)
  if causal:
    allowed &= jnp.tril(jnp.ones((q_segments.shape[1], k_segments.shape[1]), bool))
  return allowed[:, None]


def attention_bias(q_segments: jax.Array, k_segments: jax.Array, causal: bool) -> jax.Array:
  """[B, Q], [B, K] segment ids (0 = padding) -> [B, 1, Q, K] additive bias: 0 where allowed, NEG_INF elsewhere."""
  return jnp.where(attention_mask(q_segments, k_segments, causal), 0.0, NEG_INF).astype(jnp.float32)


def fused_mask(q_segments: jax.Array, k_segments: jax.Array, causal: bool) -> jax.Array:
  """`attention_mask` with key 0 allowed to every padding query, so that no query row is empty: JAX hands cuDNN a
  boolean mask as a bias of -2^41, so an empty row's logsumexp is about -2e12, which cuDNN's flash backward may turn
  into NaN that reaches every gradient though the row is out of the loss. Real queries are unchanged; padding
  outputs feed nothing real (padding is never routed, attended to or scored)."""
  lone = (q_segments == 0)[:, None, :, None] & (jnp.arange(k_segments.shape[1]) == 0)  # [B, 1, Q, K]
  return attention_mask(q_segments, k_segments, causal) | lone


def packing_mask(q_segments: jax.Array, k_segments: jax.Array, causal: bool, attention: str, kernel: bool = False):
  """[B, Q], [B, K] segment ids -> what the attention reads of the packing outside decoding: the segment ids (an
  attention kernel: `kernel`), the boolean `fused_mask` ('fused') or the additive `attention_bias` ('xla'),
  [B, 1, Q, K]."""
  if kernel:
    return q_segments, k_segments
  if attention == "fused":
    return fused_mask(q_segments, k_segments, causal)
  return attention_bias(q_segments, k_segments, causal)


def source_bias(k_segments: jax.Array) -> jax.Array:
  """[B, K] source segment ids -> [B, 1, 1, K]: every query row of a sentence may see its real source tokens."""
  return jnp.where(k_segments > 0, 0.0, NEG_INF)[:, None, None, :]


def shift_right(targets: jax.Array, segments: jax.Array, start: int = 0) -> jax.Array:
  """[B, L] targets -> [B, L] decoder inputs: moved one step right, `start` (the tokenizer's start id: PAD as BOS,
  NLLB's EOS) at each packed pair's start."""
  shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  prev_segments = jnp.pad(segments, ((0, 0), (1, 0)))[:, :-1]
  return jnp.where(segments == prev_segments, shifted, start)


def source_tags(src_tokens, src_segments, segments, beams: bool = False) -> jax.Array:
  """int32 [B', L]: the first source token (the `<xx>` language tag) of the pair of each token of `segments` [B', L]
  (0 for padding), pairs matched by segment id in src_tokens, src_segments [B, Ls]. beams=True: decoding, B' = B x
  beams rows, row n holding sentence n // beams."""
  B, Ls = src_tokens.shape
  starts = (src_segments > 0) & (src_segments != jnp.pad(src_segments[:, :-1], ((0, 0), (1, 0))))
  # tag[b, k]: the tag of pair k of row b (each pair starts once: no two writes meet; the rest are dropped)
  tag = jnp.zeros((B, Ls + 1), jnp.int32).at[jnp.arange(B)[:, None], jnp.where(starts, src_segments, Ls + 1)].set(
      src_tokens, mode="drop")
  if beams:
    return jnp.repeat(tag[:, 1], segments.shape[0] // B)[:, None].repeat(segments.shape[1], axis=1)
  return jnp.take_along_axis(tag, segments, axis=1)


def attention_probs(q: jax.Array, k: jax.Array, bias: jax.Array) -> jax.Array:
  """q [B, Q, A, D] (already scaled), k [B, K, A, D], bias broadcastable to [B, A, Q, K] -> float32 softmax
  [B, A, Q, K]."""
  logits = jnp.einsum("BQAD,BKAD->BAQK", q, k).astype(jnp.float32) + bias
  return jax.nn.softmax(logits, axis=-1)


def attention_implementation(platform: str, dtype, head_dim: int, q_len: int, k_len: int) -> str:
  """`jax.nn.dot_product_attention`'s implementation for model.attention='fused': 'cudnn' on a GPU when cuDNN takes
  the inputs, else 'xla' (the reference's math). cuDNN's flash attention takes (jax._src.cudnn.
  fused_attention_stablehlo, JAX 0.12) fp16/bf16, a head dim a multiple of 8 up to 128 (256 from Hopper on: 128
  needs no device query), and with a mask even lengths."""
  takes = (jnp.dtype(dtype) in (jnp.float16, jnp.bfloat16) and head_dim % 8 == 0 and head_dim <= 128
           and q_len % 2 == 0 and k_len % 2 == 0)
  return "cudnn" if platform == "gpu" and takes else "xla"


def fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, causal: bool) -> jax.Array:
  """q [B, Q, A, D] (already scaled), k, v [B, K, A, D], mask [B, 1, Q, K] bool (True = may attend) -> [B, Q, A, D]
  by `jax.nn.dot_product_attention`. is_causal repeats the mask's causal part so that cuDNN skips blocks."""
  implementation = attention_implementation(jax.default_backend(), q.dtype, q.shape[-1], q.shape[1], k.shape[1])
  return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=1.0, is_causal=causal,
                                      implementation=implementation)


def per_sentence(q: jax.Array, sentences: int) -> jax.Array:
  """q [N, Q, A, D] with N = sentences x beams rows (a sentence's beams adjacent) -> [sentences, beams*Q, A, D]:
  the beams of a sentence become query positions of that sentence, so they share its source keys and values."""
  N, Q, A, D = q.shape
  return q.reshape(sentences, N // sentences * Q, A, D)


def cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array) -> jax.Array:
  """Attention over a decoding cache: q [B, Q, A, D] (already scaled), k [A, B, D, K], v [A, B, K, D], bias
  [B, 1, Q, K] -> [B, Q, A, D]. The cache is laid out as the matmuls read it, so XLA copies it at no step."""
  logits = jnp.einsum("ABQD,ABDK->ABQK", q.transpose(2, 0, 1, 3), k).astype(jnp.float32) + bias.swapaxes(0, 1)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  return jnp.einsum("ABQK,ABKD->ABQD", probs, v).transpose(1, 2, 0, 3)


def param(module: nn.Module, name: str, shape: tuple, names: tuple, init=None):
  """A float32 parameter with logical axis names (LeCun normal unless `init` is given)."""
  init = init or nn.initializers.lecun_normal()
  return module.param(name, nn.with_logical_partitioning(init, names), shape, jnp.float32)


def layer_norm(name: str, epsilon: float = LAYER_NORM_EPSILON) -> nn.LayerNorm:
  """LayerNorm over M whose scale and bias carry the 'embed' axis."""
  return nn.LayerNorm(name=name, epsilon=epsilon,
                      scale_init=nn.with_logical_partitioning(NORM_INITS["scale"], ("embed",)),
                      bias_init=nn.with_logical_partitioning(NORM_INITS["bias"], ("embed",)))


def norm_terms(x: jax.Array, epsilon: float = LAYER_NORM_EPSILON) -> tuple[jax.Array, jax.Array]:
  """x [..., M] -> (x - mean, 1 / std [..., 1]) over M in float32, exactly as flax's LayerNorm computes them."""
  x = x.astype(jnp.float32)
  mean = x.mean(-1, keepdims=True)
  var = jnp.maximum(0.0, (x * x).mean(-1, keepdims=True) - mean * mean)
  return x - mean, jax.lax.rsqrt(var + epsilon)


def normalize(x: jax.Array, scale: jax.Array, bias: jax.Array, epsilon: float = LAYER_NORM_EPSILON) -> jax.Array:
  """x [..., M], scale, bias [M] -> the float32 layer norm over M as `layer_norm` (flax's LayerNorm) computes it."""
  centered, inv = norm_terms(x, epsilon)
  return centered * (inv * scale) + bias


def biased(y: jax.Array, b: jax.Array | None) -> jax.Array:
  """y [..., *b.shape] + b (cast to y's dtype), or y where there is no bias."""
  return y if b is None else y + b.astype(y.dtype)


class NormParams(nn.Module):
  """A layer norm's (scale, bias) [M] as `layer_norm`'s, for `Attention` to apply (its Pallas kernels fold it in)."""

  features: int

  @nn.compact
  def __call__(self):
    return tuple(param(self, name, (self.features,), ("embed",), init) for name, init in NORM_INITS.items())


class Attention(nn.Module):
  """Multi-head attention: x [B, Q, M] attends to kv [B, K, M] -> [B, Q, M].

  Decoding, cross-attention computes the source's keys and values once per sentence (collection 'memory');
  self-attention writes each step's into its row's beam slot (collection 'cache'), and the bias [B, 1, R, L*R]
  says which (position, slot) pairs each of R beams descends from. A sentence's beams attend as its queries.
  """

  num_heads: int
  head_dim: int
  dtype: Any = jnp.float32
  dropout_rate: float = 0.0
  is_cross: bool = False
  decode: bool = False
  attention: str = "xla"  # model.attention: what `bias` is outside decoding (`packing_mask`)
  causal: bool = False  # the decoder's self-attention (the bias or mask holds it; the kernel is told too)
  kernel: Callable | None = None  # the whole block outside decoding (`ops.Ops.attention`; `bias`: segment ids)
  use_bias: bool = False  # model.bias: biases on q, k, v [A, D] and out [M]
  epsilon: float = LAYER_NORM_EPSILON  # of the layer norm before it

  @nn.compact
  def __call__(self, x, kv, bias, *, norm, deterministic: bool, decode_step=None):
    """x [B, Q, M], normalized by norm = (scale, bias) [M], attends to kv [B, K, M] (cross-attention; None for later
    decoding steps) or to itself -> [B, Q, M] in the computation dtype."""
    A, D, M, dt = self.num_heads, self.head_dim, x.shape[-1], self.dtype
    init = nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=0, out_axis=(1, 2))
    wq, wk, wv = (param(self, n, (M, A, D), ("embed", "heads", "kv"), init) for n in ("query", "key", "value"))
    wo = param(self, "out", (A, D, M), ("heads", "kv", "embed"),
               nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=(0, 1), out_axis=2))
    bq, bk, bv, bo = [None] * 4
    if self.use_bias:
      bq, bk, bv = (param(self, f"{n}_bias", (A, D), ("heads", "kv"), nn.initializers.zeros)
                    for n in ("query", "key", "value"))
      bo = param(self, "out_bias", (M,), ("embed",), nn.initializers.zeros)
    if self.kernel is not None and not self.decode:  # model.bias is refused with a kernel (kernels.seam.check)
      return self.kernel(x, kv if self.is_cross else None, norm, (wq, wk, wv, wo), *bias, causal=self.causal, dtype=dt)
    x = normalize(x, *norm, self.epsilon)
    kv = kv if self.is_cross else x
    q = biased(weight_einsum("BQM,MAD->BQAD", x.astype(dt), wq), bq) * D ** -0.5  # scaled after the bias, as fairseq
    project = lambda w, b: biased(weight_einsum("BKM,MAD->BKAD", kv.astype(dt), w), b)  # noqa: E731
    if self.decode and self.is_cross:
      k = self.variable("memory", "key", lambda: biased(jnp.einsum("BKM,MAD->ABDK", kv.astype(dt), wk.astype(dt)),
                                                        None if bk is None else bk[:, None, :, None])).value
      v = self.variable("memory", "value", lambda: biased(jnp.einsum("BKM,MAD->ABKD", kv.astype(dt), wv.astype(dt)),
                                                          None if bv is None else bv[:, None, None, :])).value
      out = cached_attention(per_sentence(q, k.shape[1]), k, v, bias).reshape(q.shape)
    elif self.decode:
      out = self._decode_step(q, project(wk, bk), project(wv, bv), bias, decode_step)
    elif self.attention == "fused":
      out = fused_attention(q, project(wk, bk), project(wv, bv), bias, self.causal)
    else:
      k, v = project(wk, bk), project(wv, bv)
      probs = nn.Dropout(self.dropout_rate)(attention_probs(q, k, bias), deterministic=deterministic)
      out = jnp.einsum("BAQK,BKAD->BQAD", probs.astype(dt), v)
    return biased(weight_einsum("BQAD,ADM->BQM", out.astype(dt), wo), bo)

  def _decode_step(self, q, k, v, bias, step):
    """q, k, v [N, 1, A, D] of one step, N = B x R rows, bias [B, 1, R, L*R] -> [N, 1, A, D]. Row b*R + r writes
    at position t*R + r of its sentence's cache (keys [A, B, D, L*R], values [A, B, L*R, D]: a step writes one
    contiguous block). The first call only creates the cache and returns zeros."""
    B, _, R, LR = bias.shape
    A, D = k.shape[2:]
    is_new = not self.has_variable("cache", "key")
    ck = self.variable("cache", "key", jnp.zeros, (A, B, D, LR), k.dtype)
    cv = self.variable("cache", "value", jnp.zeros, (A, B, LR, D), v.dtype)
    if is_new:
      return jnp.zeros_like(q)
    k, v = k.reshape(B, R, A, D).transpose(2, 0, 3, 1), v.reshape(B, R, A, D).transpose(2, 0, 1, 3)
    ck.value = jax.lax.dynamic_update_slice_in_dim(ck.value, k, step * R, axis=3)
    cv.value = jax.lax.dynamic_update_slice_in_dim(cv.value, v, step * R, axis=2)
    return cached_attention(per_sentence(q, B), ck.value, cv.value, bias).reshape(q.shape)


class DenseFFN(nn.Module):
  """x [B, L, M] -> relu(x wi [M, F] + bi) wo [F, M] + bo -> [B, L, M] (biases with model.bias)."""

  mlp_dim: int
  dtype: Any = jnp.float32
  dropout_rate: float = 0.0
  use_bias: bool = False

  @nn.compact
  def __call__(self, x, *, deterministic: bool):
    M, F, dt = x.shape[-1], self.mlp_dim, self.dtype
    wi = param(self, "wi", (M, F), ("embed", "mlp"))
    wo = param(self, "wo", (F, M), ("mlp", "embed"))
    bi, bo = (param(self, n, (d,), (axis,), nn.initializers.zeros) if self.use_bias else None
              for n, d, axis in (("bi", F, "mlp"), ("bo", M, "embed")))
    h = jax.nn.relu(biased(weight_einsum("BLM,MF->BLF", x.astype(dt), wi), bi))
    h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return biased(weight_einsum("BLF,FM->BLM", h, wo), bo)

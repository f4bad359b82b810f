"""Autoregressive decoding with a key/value cache: greedy and beam search, jitted, with static shapes.

Beams are flattened into the batch (N = B * K rows); the decoder cache's arrays are [..., N, max_len, A, D], so
reordering beams gathers along axis ndim - 4. Sequences start from PAD (id 0) and end at EOS.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from gshard_mt.data.packing import SOURCE_KEYS
from gshard_mt.data.tokenizer import EOS_ID, PAD_ID, UNK_ID
from gshard_mt.model.layers import NEG_INF
from gshard_mt.model.transformer import Transformer

# step_fn(tokens [N] int32, position int32, cache) -> (log_probs [N, V] float32, cache)
StepFn = Callable


def length_penalty(length, alpha: float):
  """GNMT's ((5 + length) / 6) ** alpha."""
  return ((5.0 + length) / 6.0) ** alpha


def greedy_search(step_fn: StepFn, cache, batch_size: int, max_len: int):
  """Argmax decoding until every row has emitted EOS or max_len tokens; returns int32 [B, max_len]."""

  def body(state):
    i, tokens, done, cache = state
    prev = jnp.where(i == 0, PAD_ID, tokens[:, jnp.maximum(i - 1, 0)])
    log_probs, cache = step_fn(prev, i, cache)
    nxt = jnp.where(done, PAD_ID, jnp.argmax(log_probs, -1).astype(jnp.int32))
    return i + 1, tokens.at[:, i].set(nxt), done | (nxt == EOS_ID), cache

  def cond(state):
    i, _, done, _ = state
    return (i < max_len) & ~jnp.all(done)

  init = (jnp.int32(0), jnp.zeros((batch_size, max_len), jnp.int32), jnp.zeros((batch_size,), bool), cache)
  return jax.lax.while_loop(cond, body, init)[1]


def _gather_beams(tree, beam_index, batch_size, beam_size):
  """Reorders the rows of every cache array: beam_index [B, K] picks, for each row, a beam of its sentence."""
  flat = (jnp.arange(batch_size)[:, None] * beam_size + beam_index).reshape(-1)
  return jax.tree.map(lambda x: jnp.take(x, flat, axis=x.ndim - 4), tree)


def beam_search(step_fn: StepFn, cache, batch_size: int, beam_size: int, max_len: int, alpha: float = 0.6):
  """Beam search with GNMT length penalty; returns (tokens int32 [B, K, max_len], scores [B, K]), best first.

  Finished hypotheses are scored logprob / length_penalty(length); the search stops early when no live beam
  can beat the worst finished one of every sentence.
  """
  B, K, L = batch_size, beam_size, max_len
  max_penalty = length_penalty(L, alpha)

  def body(state):
    i, live, live_lp, fin, fin_score, fin_flag, cache = state
    prev = jnp.where(i == 0, PAD_ID, live[:, :, jnp.maximum(i - 1, 0)]).reshape(B * K)
    log_probs, cache = step_fn(prev, i, cache)
    V = log_probs.shape[-1]
    candidates = (live_lp[:, :, None] + log_probs.reshape(B, K, V)).reshape(B, K * V)
    top_lp, top_idx = jax.lax.top_k(candidates, 2 * K)  # 2K: at least K of them do not end here
    beam, token = top_idx // V, (top_idx % V).astype(jnp.int32)
    seqs = jnp.take_along_axis(live, beam[:, :, None], axis=1).at[:, :, i].set(token)  # [B, 2K, L]
    ends = token == EOS_ID
    # New live beams: the best K candidates that did not end.
    live_lp2 = jnp.where(ends, NEG_INF, top_lp)
    keep_lp, keep = jax.lax.top_k(live_lp2, K)
    live = jnp.take_along_axis(seqs, keep[:, :, None], axis=1)
    cache = _gather_beams(cache, jnp.take_along_axis(beam, keep, axis=1), B, K)
    # New finished: merge the candidates that ended with the old finished set, keep the best K.
    new_score = jnp.where(ends, top_lp / length_penalty(i + 1, alpha), NEG_INF)
    all_seqs = jnp.concatenate([fin, seqs], axis=1)
    all_score = jnp.concatenate([fin_score, new_score], axis=1)
    all_flag = jnp.concatenate([fin_flag, ends], axis=1)
    fin_score, best = jax.lax.top_k(all_score, K)
    fin = jnp.take_along_axis(all_seqs, best[:, :, None], axis=1)
    fin_flag = jnp.take_along_axis(all_flag, best, axis=1)
    return i + 1, live, keep_lp, fin, fin_score, fin_flag, cache

  def cond(state):
    i, _, live_lp, _, fin_score, fin_flag, _ = state
    best_possible = live_lp[:, 0] / max_penalty  # log-probs only fall; the penalty is at most max_penalty
    worst_finished = jnp.where(fin_flag.all(axis=1), fin_score.min(axis=1), NEG_INF)
    return (i < L) & ~jnp.all(worst_finished >= best_possible)

  live_lp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (K - 1), jnp.float32), (B, 1))
  init = (jnp.int32(0), jnp.zeros((B, K, L), jnp.int32), live_lp, jnp.zeros((B, K, L), jnp.int32),
          jnp.full((B, K), NEG_INF, jnp.float32), jnp.zeros((B, K), bool), cache)
  _, live, live_lp, fin, fin_score, fin_flag, _ = jax.lax.while_loop(cond, body, init)
  # A sentence with no finished hypothesis (max_len reached) returns its live beams.
  none = ~fin_flag.any(axis=1)
  tokens = jnp.where(none[:, None, None], live, fin)
  scores = jnp.where(none[:, None], live_lp / max_penalty, fin_score)
  return tokens, scores


class Translator:
  """Encodes a padded batch once and decodes it with the model's cache; `__call__` is jitted per shape."""

  def __init__(self, model_cfg, params, beam_size: int = 4, alpha: float = 0.6, max_len: int = 64):
    self.model = Transformer(model_cfg, deterministic=True, decode=True)
    self.params, self.beam_size, self.alpha, self.max_len = params, beam_size, alpha, max_len
    self._translate = jax.jit(self._run)

  def _run(self, params, batch):
    """batch: padded `inputs` [B, Ls] with segmentation/position -> best tokens [B, max_len].

    The source is encoded once, and each decoder layer's cross-attention keys and values are computed once per
    sentence (not per beam, not per step). Only the self-attention cache is reordered as beams are chosen.
    """
    B, K, L = batch["inputs"].shape[0], self.beam_size, self.max_len
    N = B * K
    src_segments = batch["inputs_segmentation"]
    memory, _ = self.model.apply({"params": params}, batch["inputs"], src_segments, batch["inputs_position"],
                                 method=Transformer.encode)

    def decoder(variables, tokens, positions, step, mutable):
      return self.model.apply(variables, memory, src_segments, tokens, jnp.ones_like(tokens), positions,
                              decode_step=step, method=Transformer.decode_logits, mutable=mutable)

    # One call over [N, L] creates the self-attention caches (zeros, full length) and fills the source keys and
    # values; its logits are unused, so XLA removes the rest of that call.
    full = jnp.zeros((N, L), jnp.int32)
    _, variables = decoder({"params": params}, full, full, 0, ["cache", "memory"])
    source_kv = variables["memory"]

    def step_fn(tokens, i, cache):
      (logits, _), variables = decoder({"params": params, "cache": cache, "memory": source_kv}, tokens[:, None],
                                       jnp.full((N, 1), i, jnp.int32), i, ["cache"])
      # PAD and UNK are never outputs: PAD starts a sentence, and every character has a byte piece.
      logits = logits[:, 0].astype(jnp.float32).at[:, (PAD_ID, UNK_ID)].set(NEG_INF)
      return jax.nn.log_softmax(logits), variables["cache"]

    if K == 1:
      return greedy_search(step_fn, variables["cache"], B, L)
    tokens, _ = beam_search(step_fn, variables["cache"], B, K, L, self.alpha)
    return tokens[:, 0]

  def __call__(self, batch: dict) -> np.ndarray:
    return np.asarray(self._translate(self.params, {k: batch[k] for k in SOURCE_KEYS}))

  def by_pair(self, batch: dict) -> dict[int, list[int]]:
    """The output ids (up to EOS) of each real row of a padded batch, keyed by its `index` (padding rows, -1,
    are left out)."""
    return {int(pair): seq for pair, seq in zip(batch["index"], cut_at_eos(self(batch))) if pair >= 0}


def cut_at_eos(tokens: np.ndarray) -> list[list[int]]:
  """Rows of token ids up to (not including) the first EOS."""
  out = []
  for row in np.asarray(tokens).tolist():
    out.append(row[: row.index(EOS_ID)] if EOS_ID in row else row)
  return out


"""Autoregressive decoding with a key/value cache: greedy and beam search, jitted, with static shapes.

Beams are flattened into the batch (N = B * K rows, a sentence's beams adjacent). The cache is never reordered:
each row writes into its own beam slot, and a table of slots [N, max_len] (which slot holds each row's ancestor at
each position) is reordered instead; `beam_bias` makes it the self-attention bias. The tokenizer's ids
(`SpecialIds`) say what a sequence starts from (its `start`), where it ends (EOS) and what is never output; its
`forced` tokens (an NLLB target's language code) are the first outputs whatever the model says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from gshard_mt.batch import SOURCE_KEYS
from gshard_mt.config.sections import ModelConfig
from gshard_mt.data.tokenizer import SENTENCEPIECE_IDS, SpecialIds
from gshard_mt.errors import ConfigError
from gshard_mt.model.layers import NEG_INF
from gshard_mt.model.transformer import Transformer
from gshard_mt.parallel import distributed

# step_fn(tokens [N] int32, position int32, cache, live bool [N]) -> (log_probs [N, V] float32, cache); `live` marks
# the rows whose output the search may still use (an MoE layer routes only those, so that a beam not yet opened, a
# finished row or sentence, or a padding row takes no expert capacity from the others)
StepFn = Callable


def length_penalty(length, alpha: float):
  """GNMT's ((5 + length) / 6) ** alpha."""
  return ((5.0 + length) / 6.0) ** alpha


def forcing(log_probs: jax.Array, step, forced: tuple[int, ...]) -> jax.Array:
  """log_probs [N, V] at `step` -> at step k < len(forced), every token's -inf but forced[k]'s, 0 (as transformers'
  ForcedBOSTokenLogitsProcessor); unchanged at later steps."""
  if not forced:
    return log_probs
  table = jnp.asarray(forced, jnp.int32)
  only = jnp.where(jnp.arange(log_probs.shape[-1]) == table[jnp.minimum(step, len(forced) - 1)], 0.0, -jnp.inf)
  return jnp.where(step < len(forced), only.astype(log_probs.dtype), log_probs)


def greedy_search(step_fn: StepFn, cache, batch_size: int, max_len: int, ids: SpecialIds = SENTENCEPIECE_IDS,
                  forced: tuple[int, ...] = ()):
  """Argmax decoding from ids.start until every row has emitted EOS or max_len tokens, the first outputs `forced`;
  returns int32 [B, max_len] (PAD after EOS)."""

  def body(state):
    i, tokens, done, cache = state
    prev = jnp.where(i == 0, ids.start, tokens[:, jnp.maximum(i - 1, 0)])
    log_probs, cache = step_fn(prev, i, cache, ~done)
    nxt = jnp.where(done, ids.pad, jnp.argmax(forcing(log_probs, i, forced), -1).astype(jnp.int32))
    return i + 1, tokens.at[:, i].set(nxt), done | (nxt == ids.eos), cache

  def cond(state):
    i, _, done, _ = state
    return (i < max_len) & ~jnp.all(done)

  init = (jnp.int32(0), jnp.full((batch_size, max_len), ids.pad, jnp.int32), jnp.zeros((batch_size,), bool), cache)
  return jax.lax.while_loop(cond, body, init)[1]


def beam_bias(slots: jax.Array, step, beams: int) -> jax.Array:
  """slots [N, L] (the beam slot holding row n's key at position t), step -> self-attention bias [B, 1, R, L*R]
  for B = N / R sentences of R beams: row b*R + q sees slot r at position t (index t*R + r) iff
  slots[b*R + q, t] == r and t <= step."""
  N, L = slots.shape
  seen = (slots[:, :, None] == jnp.arange(beams)) & (jnp.arange(L) <= step)[:, None]  # [N, L, R]
  return jnp.where(seen, 0.0, NEG_INF).reshape(N // beams, 1, beams, L * beams)


def best_candidates(scores: jax.Array, count: int, block: int = 32) -> tuple[jax.Array, jax.Array, jax.Array]:
  """scores [B, K, V] -> the best `count` of each sentence's K x V: (scores, beam, token), each [B, count], exactly
  as jax.lax.top_k over the flattened K x V (equal scores: lower beam, then lower token, first).

  That top_k costs a CPU about as much as the output matmul, so it runs over the maxima of blocks of `block`
  candidates, then over the candidates of the `count` best blocks (which hold the best `count`), in order.
  """
  B, K, V = scores.shape
  width = V + -V % block  # each beam padded to whole blocks
  if K * width < count * block:  # fewer blocks than wanted
    top, flat = jax.lax.top_k(scores.reshape(B, K * V), count)
    return top, flat // V, flat % V
  blocks = jnp.pad(scores, ((0, 0), (0, 0), (0, width - V)), constant_values=-jnp.inf).reshape(B, -1, block)
  chosen = jnp.sort(jax.lax.top_k(blocks.max(axis=-1), count)[1], axis=-1)  # [B, count] block ids, in order
  top, pick = jax.lax.top_k(jnp.take_along_axis(blocks, chosen[:, :, None], axis=1).reshape(B, -1), count)
  flat = jnp.take_along_axis(chosen, pick // block, axis=1) * block + pick % block
  return top, flat // width, flat % width


def take_rows(state, rows):
  """The default beam reordering: every array of `state` has the N rows on axis 0; rows [N] picks them."""
  return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), state)


def beam_search(step_fn: StepFn, cache, batch_size: int, beam_size: int, max_len: int, alpha: float = 0.6,
                reorder: Callable = take_rows, n_best: int | None = None, ids: SpecialIds = SENTENCEPIECE_IDS,
                forced: tuple[int, ...] = ()):
  """Beam search with GNMT length penalty -> (tokens int32 [B, K, max_len], scores [B, K]), best first; sequences
  start from ids.start and their first tokens are `forced` (`forcing`).

  Finished hypotheses score logprob / length_penalty(length); the search stops when no live beam can beat the
  n_best-th finished one (default: the K-th) of every sentence, so the first n_best are the full search's (for
  alpha >= 0: the bound on a live beam's score takes the penalty at most length_penalty(max_len)).
  `reorder(cache, rows [N])` gives row n the state of row rows[n].
  """
  B, K, L = batch_size, beam_size, max_len
  n = K if n_best is None else n_best
  max_penalty = length_penalty(L, alpha)

  def settled(live_lp, fin_score, fin_flag):
    """bool [B]: no live beam of the sentence can beat its n-th finished hypothesis."""
    best_possible = live_lp[:, 0] / max_penalty  # log-probs only fall; the penalty is at most max_penalty
    return jnp.where(fin_flag[:, n - 1], fin_score[:, n - 1], NEG_INF) >= best_possible  # fin: best first

  def body(state):
    i, live, live_lp, fin, fin_score, fin_flag, cache = state
    prev = jnp.where(i == 0, ids.start, live[:, :, jnp.maximum(i - 1, 0)]).reshape(B * K)
    opened = (live_lp > NEG_INF / 2) & ~settled(live_lp, fin_score, fin_flag)[:, None]  # [B, K]
    log_probs, cache = step_fn(prev, i, cache, opened.reshape(B * K))
    log_probs = forcing(log_probs, i, forced)
    # The best 2K candidates: at least K of them do not end here.
    top_lp, beam, token = best_candidates(live_lp[:, :, None] + log_probs.reshape(B, K, -1), 2 * K)
    seqs = jnp.take_along_axis(live, beam[:, :, None], axis=1).at[:, :, i].set(token)  # [B, 2K, L]
    ends = token == ids.eos
    # New live beams: the best K candidates that did not end.
    live_lp2 = jnp.where(ends, NEG_INF, top_lp)
    keep_lp, keep = jax.lax.top_k(live_lp2, K)
    live = jnp.take_along_axis(seqs, keep[:, :, None], axis=1)
    cache = reorder(cache, (jnp.arange(B)[:, None] * K + jnp.take_along_axis(beam, keep, axis=1)).reshape(-1))
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
    return (i < L) & ~jnp.all(settled(live_lp, fin_score, fin_flag))

  live_lp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (K - 1), jnp.float32), (B, 1))
  init = (jnp.int32(0), jnp.full((B, K, L), ids.pad, jnp.int32), live_lp, jnp.full((B, K, L), ids.pad, jnp.int32),
          jnp.full((B, K), NEG_INF, jnp.float32), jnp.zeros((B, K), bool), cache)
  _, live, live_lp, fin, fin_score, fin_flag, _ = jax.lax.while_loop(cond, body, init)
  # A sentence with no finished hypothesis (max_len reached) returns its live beams.
  none = ~fin_flag.any(axis=1)
  tokens = jnp.where(none[:, None, None], live, fin)
  scores = jnp.where(none[:, None], live_lp / max_penalty, fin_score)
  return tokens, scores


def unscanned(params, model: ModelConfig) -> dict:
  """Scanned parameters (each stack's units stacked on axis 0 under 'units') as scan_layers=False names them
  ('unit_0', 'unit_1', ...)."""
  if not model.scan_layers:
    return params
  out = dict(params)
  for stack in ("encoder", "decoder"):
    units = params[stack]["units"]
    count = jax.tree.leaves(units)[0].shape[0]
    out[stack] = {k: v for k, v in params[stack].items() if k != "units"} | {
        f"unit_{u}": jax.tree.map(lambda x, u=u: x[u], units) for u in range(count)}
  return out


def check_length(model: ModelConfig, max_len: int):
  """A ConfigError where decoding `max_len` tokens runs past the model section's learned positions (`jnp.take`
  beyond the table gives NaN embeddings)."""
  if model.positions == "learned" and max_len > model.max_position:
    raise ConfigError(f"a decoding length of {max_len} (--max_decode_len) exceeds model.max_position="
                      f"{model.max_position}, the learned positions")


class Translator:
  """Encodes a padded batch once and decodes it with the model's cache; jitted per shape.

  The layers are unrolled (scan_layers=False, `unscanned` parameters): each layer's cache is then an array of the
  loop state, written in place, where a scan over the layers would copy it. With `batch_sharding` (the rows'
  NamedSharding), every process passes the same whole batch, places its own rows and gets the whole output.
  `ids` and `forced`: the tokenizer's (`SpecialIds`, its `forced(target language)`).
  """

  def __init__(self, model_cfg, params, beam_size: int = 4, alpha: float = 0.6, max_len: int = 64,
               batch_sharding: jax.sharding.NamedSharding | None = None, *, ids: SpecialIds = SENTENCEPIECE_IDS,
               forced: tuple[int, ...] = ()):
    check_length(model_cfg.model, max_len)
    if ids.start != model_cfg.start_id:
      raise ValueError(f"the tokenizer starts from {ids.start}, the model (its start_id) from {model_cfg.start_id}")
    self.ids, self.forced = ids, tuple(forced)
    self.model_cfg, self.params = model_cfg, params
    unrolled = dataclasses.replace(model_cfg, model=dataclasses.replace(model_cfg.model, scan_layers=False))
    self.model = Transformer(unrolled, deterministic=True, decode=True)
    self.beam_size, self.alpha, self.max_len = beam_size, alpha, max_len
    self.batch_sharding = batch_sharding
    self._translate = jax.jit(self._run)

  def step(self, params, batch) -> tuple[StepFn, tuple]:
    """(the `StepFn` of a padded source batch (`inputs` [B, Ls] with segmentation/position), its initial state). The
    source is encoded once, and its cross-attention keys and values computed once per sentence."""
    B, K, L = batch["inputs"].shape[0], self.beam_size, self.max_len
    N = B * K
    params = unscanned(params, self.model_cfg.model)
    src_segments = batch["inputs_segmentation"]
    memory, _ = self.model.apply({"params": params}, batch["inputs"], src_segments, batch["inputs_position"],
                                 method=Transformer.encode)

    real = jnp.repeat((src_segments > 0).any(axis=1), K)  # [N]: the rows of real sentences, not padding rows

    def decoder(variables, tokens, step, slots, mutable, live=None):
      tokens = tokens[:, None]
      segments = (real if live is None else real & live)[:, None].astype(jnp.int32)  # what the MoE layers route
      return self.model.apply(variables, memory, src_segments, tokens, segments,
                              jnp.full((N, 1), step, jnp.int32), decode_step=step,
                              self_bias=beam_bias(slots, step, K), src_tokens=batch["inputs"],
                              method=Transformer.decode_logits, mutable=mutable)

    # The first call creates the self-attention caches (zeros) and fills the source keys and values; its logits
    # are unused, so XLA removes the rest of that call.
    slots = jnp.zeros((N, L), jnp.int32)
    _, variables = decoder({"params": params}, jnp.zeros((N,), jnp.int32), 0, slots, ["cache", "memory"])
    source_kv = variables["memory"]
    own_slot = jnp.arange(N, dtype=jnp.int32) % K

    def step_fn(tokens, i, state, live):
      cache, slots = state
      slots = slots.at[:, i].set(own_slot)
      (logits, _), variables = decoder({"params": params, "cache": cache, "memory": source_kv}, tokens, i, slots,
                                       ["cache"], live)
      logits = logits[:, 0].astype(jnp.float32)
      if self.ids.never:  # e.g. PAD and UNK of this project's tokenizer: PAD starts, a byte piece has every character
        logits = logits.at[:, self.ids.never].set(NEG_INF)
      return jax.nn.log_softmax(logits), (variables["cache"], slots)

    return step_fn, (variables["cache"], slots)

  def _run(self, params, batch):
    """batch: padded `inputs` [B, Ls] with segmentation/position -> best tokens [B, max_len]."""
    B, K, L = batch["inputs"].shape[0], self.beam_size, self.max_len
    step_fn, state = self.step(params, batch)
    if K == 1:
      return greedy_search(step_fn, state, B, L, self.ids, self.forced)
    tokens, _ = beam_search(step_fn, state, B, K, L, self.alpha, reorder=lambda s, rows: (s[0], s[1][rows]),
                            n_best=1, ids=self.ids, forced=self.forced)
    return tokens[:, 0]

  def __call__(self, batch: dict) -> np.ndarray:
    """Padded source rows [B, Ls] -> output tokens [B, max_len]."""
    source = {k: batch[k] for k in SOURCE_KEYS}
    if self.batch_sharding is None:
      return np.asarray(self._translate(self.params, source))
    rows = len(source["inputs"])
    extra = -rows % distributed.row_shards(self.batch_sharding)  # empty rows, so that every device has whole rows
    source = {k: np.pad(v, ((0, extra), (0, 0))) for k, v in source.items()}
    out = self._translate(self.params, distributed.placed(source, self.batch_sharding))
    return distributed.gathered(out)[:rows]

  def by_pair(self, batch: dict) -> dict[int, list[int]]:
    """The output ids (up to EOS) of each real row (`index` >= 0) of a padded batch, keyed by its `index`."""
    return {int(pair): seq for pair, seq in zip(batch["index"], cut_at_eos(self(batch), self.ids.eos)) if pair >= 0}


def cut_at_eos(tokens: np.ndarray, eos: int = SENTENCEPIECE_IDS.eos) -> list[list[int]]:
  """Rows of token ids up to (not including) the first `eos`."""
  return [row[: row.index(eos)] if eos in row else row for row in np.asarray(tokens).tolist()]


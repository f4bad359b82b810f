"""Decoding with a tokenizer's ids other than this project's (NLLB's: start from EOS, no id masked) and a forced
first token (the target language's code), greedy and beam search against plain per-step references."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.data.tokenizer import SpecialIds
from gshard_mt.model import decode

IDS = SpecialIds(pad=1, eos=2, unk=3, start=2, never=())
V, L, FORCED = 6, 4, 5


def toy(seed, B):
  """log_probs [B, V, L, V] (sentence, previous token, position, token) and a step_fn over B x K rows of them."""
  table = jax.random.normal(jax.random.key(seed), (B, V, L, V)) * 2.0
  log_probs = jax.nn.log_softmax(table.at[..., IDS.eos].add(0.5))

  def step_fn(tokens, i, cache, live=None):
    return log_probs[jnp.arange(len(tokens)) * B // len(tokens), tokens, i], cache

  return np.asarray(log_probs, np.float64), step_fn


def greedy_reference(log_probs):
  """Step by step from IDS.start: the forced token first, then argmax until EOS (PAD after it)."""
  B = len(log_probs)
  out = np.full((B, L), IDS.pad, np.int32)
  for b in range(B):
    prev = IDS.start
    for i in range(L):
      prev = FORCED if i == 0 else int(np.argmax(log_probs[b, prev, i]))
      out[b, i] = prev
      if prev == IDS.eos:
        break
  return out


def exhaustive_best(log_probs, alpha):
  """Each sentence's best hypothesis [FORCED, ..., EOS] of up to L tokens (log-prob 0 for the forced one),
  scored sum(log p) / ((5 + length) / 6) ** alpha."""
  B = len(log_probs)
  best, best_score = np.full((B, L), IDS.pad, np.int32), np.full(B, -np.inf)
  others = [t for t in range(V) if t != IDS.eos]
  for length in range(2, L + 1):
    for middle in itertools.product(others, repeat=length - 2):
      seq = (FORCED, *middle, IDS.eos)
      lp = sum(log_probs[:, prev, i, tok] for i, (prev, tok) in enumerate(zip(seq, seq[1:]), start=1))
      score = lp / ((5.0 + length) / 6.0) ** alpha
      better = score > best_score
      best[better], best_score[better] = np.pad(seq, (0, L - length), constant_values=IDS.pad), score[better]
  return best, best_score


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_starts_from_the_start_id_and_forces_the_first_token(seed):
  log_probs, step_fn = toy(seed, 5)
  got = jax.jit(lambda: decode.greedy_search(step_fn, {}, 5, L, IDS, (FORCED,)))()
  np.testing.assert_array_equal(np.asarray(got), greedy_reference(log_probs))
  unforced = np.asarray(jax.jit(lambda: decode.greedy_search(step_fn, {}, 5, L, IDS))())
  assert (unforced[:, 0] != FORCED).any()  # the model alone would start otherwise


def test_beam_search_with_a_forced_token_equals_exhaustive_search():
  """A beam wide enough to keep every live prefix finds the best forced hypothesis, with its score (the forced
  token's log-prob 0, as transformers' ForcedBOSTokenLogitsProcessor gives it)."""
  B, alpha = 16, 0.6
  K = (V - 1) ** (L - 2) * V // 2  # 2K >= the candidates of the last step
  log_probs, step_fn = toy(3, B)
  tokens, scores = jax.jit(lambda: decode.beam_search(step_fn, {}, B, K, L, alpha, ids=IDS, forced=(FORCED,)))()
  want, want_scores = exhaustive_best(log_probs, alpha)
  np.testing.assert_array_equal(np.asarray(tokens[:, 0]), want)
  np.testing.assert_allclose(np.asarray(scores[:, 0]), want_scores, rtol=1e-5)


def test_forcing_is_transformers_forced_bos():
  log_probs = jnp.log(jnp.full((2, V), 1 / V))
  forced = decode.forcing(log_probs, 0, (FORCED,))
  assert forced[:, FORCED].tolist() == [0.0, 0.0] and np.isneginf(np.delete(np.asarray(forced), FORCED, 1)).all()
  np.testing.assert_array_equal(decode.forcing(log_probs, 1, (FORCED,)), log_probs)
  np.testing.assert_array_equal(decode.forcing(log_probs, 0, ()), log_probs)

"""Decoding: incremental decoding equals the full forward pass, beam 1 equals greedy, EOS and max length, the
beam-slot bias, the candidates' top-k, the early stop for the best hypothesis."""

import dataclasses
import functools
import itertools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.batch import SOURCE_KEYS
from gshard_mt.data.tokenizer import SENTENCEPIECE_IDS
from gshard_mt.model import decode
from gshard_mt.model.transformer import Transformer, dummy_batch
from gshard_mt.training.setup import build
from tests.helpers import small_config

V, L = 12, 9
EOS_ID, PAD_ID, UNK_ID = SENTENCEPIECE_IDS.eos, SENTENCEPIECE_IDS.pad, SENTENCEPIECE_IDS.unk


def table_step_fn(seed, eos_bias=0.0):
  """A toy decoder: log-probs depend on the previous token and the position; the cache counts calls per row."""
  table = jax.random.normal(jax.random.key(seed), (V, L, V)) * 3.0
  table = table.at[:, :, EOS_ID].add(eos_bias).at[:, :, PAD_ID].set(-1e9)

  def step_fn(tokens, i, cache, live=None):
    return jax.nn.log_softmax(table[tokens, i]), jax.tree.map(lambda c: c + 1, cache)

  return step_fn


def toy_cache(n):
  return {"calls": jnp.zeros((n, 1, 1, 1))}  # [..., N, len, A, D] like the model's


def greedy_reference(step_fn, batch_size, max_len):
  """Step by step in Python: argmax until EOS."""
  out = np.zeros((batch_size, max_len), np.int32)
  for b in range(batch_size):
    prev = PAD_ID
    for i in range(max_len):
      lp, _ = step_fn(jnp.full((batch_size,), prev, jnp.int32), i, toy_cache(batch_size))
      prev = int(jnp.argmax(lp[b]))
      out[b, i] = prev
      if prev == EOS_ID:
        break
  return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_matches_reference_and_beam_one_equals_greedy(seed):
  step_fn = table_step_fn(seed, eos_bias=1.0)
  greedy = np.asarray(jax.jit(lambda: decode.greedy_search(step_fn, toy_cache(3), 3, L))())
  np.testing.assert_array_equal(greedy, greedy_reference(step_fn, 3, L))
  beam, _ = jax.jit(lambda: decode.beam_search(step_fn, toy_cache(3), 3, 1, L, alpha=0.0))()
  np.testing.assert_array_equal(np.asarray(beam[:, 0]), greedy)


def sequence_logprob(step_fn, seq):
  total, prev = 0.0, PAD_ID
  for i, tok in enumerate(seq):
    lp, _ = step_fn(jnp.array([prev], jnp.int32), i, toy_cache(1))
    total += float(lp[0, tok])
    prev = tok
    if tok == EOS_ID:
      break
  return total


def test_beam_search_finds_at_least_as_good_hypotheses():
  for seed in range(4):
    step_fn = table_step_fn(seed, eos_bias=1.0)
    tokens, scores = jax.jit(lambda f=step_fn: decode.beam_search(f, toy_cache(8), 2, 4, L, alpha=0.0))()
    greedy = np.asarray(jax.jit(lambda f=step_fn: decode.greedy_search(f, toy_cache(2), 2, L))())
    for b in range(2):
      best = list(np.asarray(tokens[b, 0]))
      assert EOS_ID in best
      np.testing.assert_allclose(float(scores[b, 0]), sequence_logprob(step_fn, best), rtol=1e-4, atol=1e-4)
      assert sequence_logprob(step_fn, best) >= sequence_logprob(step_fn, list(greedy[b])) - 1e-4
      assert float(scores[b, 0]) >= float(scores[b, 1])


def test_stops_at_eos_and_respects_max_len():
  always_eos = table_step_fn(0, eos_bias=100.0)
  out = np.asarray(decode.greedy_search(always_eos, toy_cache(2), 2, L))
  assert (out[:, 0] == EOS_ID).all() and (out[:, 1:] == PAD_ID).all()
  never_eos = table_step_fn(0, eos_bias=-100.0)
  out = np.asarray(decode.greedy_search(never_eos, toy_cache(2), 2, 5))
  assert out.shape == (2, 5) and EOS_ID not in out
  tokens, _ = decode.beam_search(never_eos, toy_cache(6), 2, 3, 5)
  assert tokens.shape == (2, 3, 5) and EOS_ID not in np.asarray(tokens)


def test_length_penalty():
  assert decode.length_penalty(1, 0.0) == 1.0
  assert decode.length_penalty(7, 1.0) == pytest.approx(2.0)
  assert decode.cut_at_eos(np.array([[5, 6, EOS_ID, 7], [5, 0, 0, 0]])) == [[5, 6], [5, 0, 0, 0]]


def exhaustive_best(log_probs, alpha):
  """log_probs [B, V, L, V] (sentence, previous token, position, token) -> each sentence's best hypothesis ending
  in EOS, of every one up to L tokens (EOS counted in the length) scored sum(log p) / ((5 + length) / 6) ** alpha,
  as (tokens [B, L], scores [B])."""
  B, V, L, _ = log_probs.shape
  best, best_score = np.zeros((B, L), np.int32), np.full(B, -np.inf)
  for length in range(1, L + 1):
    for prefix in itertools.product(range(EOS_ID + 1, V), repeat=length - 1):  # neither PAD nor EOS
      seq = (*prefix, EOS_ID)
      lp = sum(log_probs[:, prev, i, tok] for i, (prev, tok) in enumerate(zip((PAD_ID, *prefix), seq)))
      score = lp / ((5.0 + length) / 6.0) ** alpha
      better = score > best_score
      best[better], best_score[better] = np.pad(seq, (0, L - length)), score[better]
  return best, best_score


def test_beam_search_with_length_penalty_equals_exhaustive_search():
  """alpha = 0.6 (eval.py's and translate.py's default): a beam wide enough to keep every live prefix and every
  candidate finds each sentence's best hypothesis of all of them, with its score. 144 toy sentences, each its own
  table of log-probs over 5 tokens (3 besides PAD and EOS), up to 5 tokens long."""
  B, V5, L5, alpha = 144, 5, 5, 0.6
  K = (V5 - 1) * (V5 - 2) ** (L5 - 1) // 2  # 2K >= the candidates of the last step
  table = jax.random.normal(jax.random.key(3), (B, V5, L5, V5)) * 2.0
  log_probs = jax.nn.log_softmax(table.at[..., EOS_ID].add(-1.0).at[..., PAD_ID].set(-1e9))

  def step_fn(tokens, i, cache, live=None):
    return log_probs[jnp.arange(B * K) // K, tokens, i], cache

  tokens, scores = jax.jit(lambda: decode.beam_search(step_fn, toy_cache(B * K), B, K, L5, alpha=alpha))()
  want, want_scores = exhaustive_best(np.asarray(log_probs, np.float64), alpha)
  np.testing.assert_array_equal(np.asarray(tokens[:, 0]), want)
  np.testing.assert_allclose(np.asarray(scores[:, 0]), want_scores, rtol=1e-5)
  # The penalty decides: without it (alpha = 0) another hypothesis wins in some sentences.
  assert 0 < (exhaustive_best(np.asarray(log_probs, np.float64), 0.0)[0] != want).any(axis=1).sum() < B


def test_length_penalty_changes_the_winner_by_hand():
  """[EOS] has probability 0.4; [a, EOS] 0.6 x 0.64 = 0.384, lower, but divided by ((5 + 2) / 6) ** 0.6 its log
  scores -0.8725 against ln 0.4 = -0.9163: with alpha = 0.6 it wins, with alpha = 0 it loses."""
  a = 3
  probs = np.full((V, L, V), 1e-9)
  probs[PAD_ID, 0, [EOS_ID, a]] = 0.4, 0.6  # the first token
  probs[a, 1, [EOS_ID, a]] = 0.64, 0.36  # after a
  probs[a, 2, EOS_ID] = 1.0  # [a, a, EOS]: 0.216 / ((5 + 3) / 6) ** 0.6, ln -1.289
  log_probs = jnp.asarray(np.log(probs), jnp.float32).at[:, :, PAD_ID].set(-1e9)

  def step_fn(tokens, i, cache, live=None):
    return log_probs[tokens, i], cache

  search = jax.jit(lambda alpha: decode.beam_search(step_fn, toy_cache(4), 2, 2, 4, alpha=alpha), static_argnums=0)
  tokens, scores = search(0.6)
  np.testing.assert_array_equal(tokens[:, 0], [[a, EOS_ID, 0, 0]] * 2)
  np.testing.assert_allclose(scores[:, 0], np.log(0.6 * 0.64) / (7 / 6) ** 0.6, rtol=1e-5)
  tokens, scores = search(0.0)
  np.testing.assert_array_equal(tokens[:, 0], [[EOS_ID, 0, 0, 0]] * 2)
  np.testing.assert_allclose(scores[:, 0], np.log(0.4), rtol=1e-5)


@pytest.fixture(scope="module")
def model_and_params():
  config = small_config(**{"model.dropout_rate": "0.0"})
  setup = build(config, 600)
  return setup.model_cfg, setup.init_state(0).params


def random_batch(B, T, vocab=600, seed=0):
  rng = np.random.default_rng(seed)
  batch = {k: np.array(v) for k, v in dummy_batch(B, T).items()}
  batch["inputs"] = rng.integers(3, vocab, (B, T)).astype(np.int32)
  batch["targets"] = rng.integers(3, vocab, (B, T)).astype(np.int32)
  batch["inputs_segmentation"][1, T - 3:] = 0  # a padded source: its keys must stay masked while decoding
  return batch


def test_incremental_decoding_equals_full_forward(model_and_params):
  """Step-by-step decoding gives the logits of the full forward pass: keys and values written in beam slots and
  read through `beam_bias` (the two beams of each sentence swap sequences half-way, so from then on each row
  finds its earlier keys in the other slot), source keys and values computed once and shared by the beams."""
  cfg, params = model_and_params
  B, K, T, swap = 3, 2, 10, 4
  batch = random_batch(B, T)
  targets = np.stack([batch["targets"], random_batch(B, T, seed=5)["targets"]], 1)  # [B, K, T]: sequence k
  forward = jax.jit(Transformer(cfg).apply)
  expected = np.stack([forward({"params": params}, batch | {"targets": targets[:, k]})[0] for k in range(K)], 1)
  model = Transformer(cfg, decode=True)
  src_segments = batch["inputs_segmentation"]
  memory, _ = model.apply({"params": params}, batch["inputs"], src_segments, batch["inputs_position"],
                          method=Transformer.encode)

  @functools.partial(jax.jit, static_argnums=3)
  def decoder(variables, tokens, step, mutable, slots):
    return model.apply(variables, memory, src_segments, tokens, jnp.ones_like(tokens), jnp.full_like(tokens, step),
                       decode_step=step, self_bias=decode.beam_bias(slots, step, K), method=Transformer.decode_logits,
                       mutable=mutable)

  rows, beam = np.repeat(np.arange(B), K), np.tile(np.arange(K), B)  # beams of a sentence are adjacent rows
  slots = np.tile(beam[:, None], (1, T))
  _, variables = decoder({"params": params}, jnp.zeros((B * K, 1), jnp.int32), 0, ("cache", "memory"), slots)
  cache, source_kv = variables["cache"], variables["memory"]
  inputs = np.concatenate([np.zeros((B, K, 1), np.int32), targets[:, :, :-1]], axis=2)
  got, want = [], []
  for i in range(T):
    sequence = beam if i < swap else 1 - beam  # the sequence each row continues
    if i == swap:
      slots[:, :swap] = 1 - beam[:, None]
    (logits, _), variables = decoder({"params": params, "cache": cache, "memory": source_kv},
                                     inputs[rows, sequence, i][:, None], i, ("cache",), slots)
    cache = variables["cache"]
    got.append(logits[:, 0])
    want.append(expected[rows, sequence, i])
  np.testing.assert_allclose(np.stack(got, 1), np.stack(want, 1), atol=1e-4, rtol=1e-4)


def test_beam_bias_against_loops():
  rng = np.random.default_rng(0)
  R, B, L, step = 3, 2, 6, 4
  slots = rng.integers(0, R, (B * R, L))
  bias = np.asarray(decode.beam_bias(jnp.asarray(slots), step, R))
  assert bias.shape == (B, 1, R, L * R)
  for b, q, t, r in np.ndindex(B, R, L, R):
    sees = slots[b * R + q, t] == r and t <= step
    assert bias[b, 0, q, t * R + r] == (0.0 if sees else decode.NEG_INF)


@pytest.mark.parametrize("B,K,V,count", [(3, 4, 4000, 8), (4, 4, 37, 8), (2, 4, 12, 8), (2, 1, 50, 2)])
def test_best_candidates_equals_top_k_over_all_candidates(B, K, V, count):
  """Exactly jax.lax.top_k over the flattened K x V, equal scores included (blocks, or one top_k when there are
  fewer blocks than candidates wanted)."""
  rng = np.random.default_rng(V)
  for scores in (rng.normal(size=(B, K, V)) * 3, np.round(rng.normal(size=(B, K, V)) * 2) / 2):
    scores = scores.astype(np.float32)
    scores[:, 1:, :5] = decode.NEG_INF  # dead beams and banned tokens tie at NEG_INF
    top, beam, token = decode.best_candidates(jnp.asarray(scores), count)
    want, flat = jax.lax.top_k(jnp.asarray(scores.reshape(B, K * V)), count)
    np.testing.assert_array_equal(top, want)
    np.testing.assert_array_equal(np.asarray(beam) * V + np.asarray(token), flat)


def test_n_best_one_finds_the_full_search_best():
  """Stopping once no live beam can beat the best finished hypothesis keeps the full search's best one."""
  for seed in range(4):
    step_fn = table_step_fn(seed, eos_bias=0.5)
    search = jax.jit(lambda n, f=step_fn: decode.beam_search(f, toy_cache(8), 2, 4, L, n_best=n), static_argnums=0)
    (tokens, scores), (best_tokens, best_scores) = search(None), search(1)
    np.testing.assert_array_equal(best_tokens[:, 0], tokens[:, 0])
    np.testing.assert_array_equal(best_scores[:, 0], scores[:, 0])


def full_forward_step_fn(cfg, params, batch, rows, T):
  """A decoding step that reruns the whole model (no cache) over the prefix so far; the 'cache' is the prefix
  [N, T, 1, 1], which beam search reorders with the beams."""
  model = Transformer(cfg)
  src = {k: jnp.repeat(batch[k], rows // batch["inputs"].shape[0], axis=0) for k in SOURCE_KEYS}

  def step_fn(tokens, i, prefix, live=None):
    prefix = prefix.at[:, i, 0, 0].set(tokens)
    targets = jnp.concatenate([prefix[:, 1:, 0, 0], jnp.zeros((rows, 1), jnp.int32)], axis=1)  # shifted back
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (rows, T))
    logits, _ = model.apply({"params": params}, src | {"targets": targets, "targets_segmentation": jnp.ones_like(
        targets), "targets_position": positions})
    logits = logits[:, i].at[:, (PAD_ID, UNK_ID)].set(decode.NEG_INF)
    return jax.nn.log_softmax(logits), prefix

  return step_fn, jnp.zeros((rows, T, 1, 1), jnp.int32)


def test_translator_equals_beam_search_over_the_full_forward_pass(model_and_params):
  """The Translator's cached decoding (source keys and values once per sentence, beam slots, its layers unrolled
  with `decode.unscanned` parameters) finds the same hypotheses as beam search whose every step runs the scanned
  model over the whole prefix, and never emits PAD or UNK."""
  cfg, params = model_and_params
  B, K, T = 4, 3, 7
  batch = random_batch(B, 8, seed=1)
  step_fn, prefix = full_forward_step_fn(cfg, params, batch, B * K, T)
  expected, _ = jax.jit(lambda: decode.beam_search(step_fn, prefix, B, K, T))()
  got = decode.Translator(cfg, params, beam_size=K, max_len=T)(batch)
  np.testing.assert_array_equal(got, np.asarray(expected[:, 0]))
  assert UNK_ID not in got


def test_translator_beam_one_is_greedy_search_over_the_full_forward_pass(model_and_params):
  cfg, params = model_and_params
  B, T = 5, 7
  batch = random_batch(B, 8, seed=2)
  step_fn, prefix = full_forward_step_fn(cfg, params, batch, B, T)
  expected = jax.jit(lambda: decode.greedy_search(step_fn, prefix, B, T))()
  np.testing.assert_array_equal(decode.Translator(cfg, params, beam_size=1, max_len=T)(batch), expected)


def test_translator_shapes_and_determinism(model_and_params):
  cfg, params = model_and_params
  batch = {k: np.asarray(v) for k, v in dummy_batch(5, 8).items()}  # 5 rows x 4 beams: groups get padded
  for beam in (1, 4):
    translator = decode.Translator(cfg, params, beam_size=beam, max_len=7)
    out = translator(batch)
    assert out.shape == (5, 7) and (out != PAD_ID).any()
    np.testing.assert_array_equal(out, translator(batch))


@pytest.mark.parametrize("beam", [1, 4])
def test_rows_not_decoding_take_no_expert_capacity(model_and_params, beam):
  """With one slot per expert (capacity drops most assignments, and does not grow with the padded group) and
  experts weighted enough to change the output, a sentence decodes the same alone as beside empty rows (the
  padding of a split's last batch, or of a batch split over devices): only rows still decoding (not padding, not
  a beam yet unopened) are routed."""
  cfg, params = model_and_params
  cfg = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, eval_capacity_factor=0.01, min_capacity=1))
  params = flax.traverse_util.unflatten_dict({k: v * 20 if "moe" in k and k[-1] == "wo" else v
                                              for k, v in flax.traverse_util.flatten_dict(params).items()})
  batch = {k: np.array(v) for k, v in dummy_batch(4, 8).items()}
  batch["inputs"] = np.random.default_rng(3).integers(3, 600, (4, 8)).astype(np.int32)
  alone = {k: v[:1] for k, v in batch.items()}
  for key in ("inputs", "inputs_segmentation", "inputs_position"):
    batch[key][1:] = 0
  translator = decode.Translator(cfg, params, beam_size=beam, max_len=7)
  np.testing.assert_array_equal(translator(batch)[0], translator(alone)[0])


def test_only_live_rows_are_routed_at_a_step(model_and_params):
  """The Translator's step routes only the rows it is told are live (`live`: not finished, a beam opened): with a
  capacity that binds, the live rows' log-probs do not depend on what the other rows hold, and do once those are
  live too (so the capacity binds and a routed row would show)."""
  cfg, params = model_and_params
  cfg = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, eval_capacity_factor=0.01, min_capacity=1))
  params = flax.traverse_util.unflatten_dict({k: v * 20 if "moe" in k and k[-1] == "wo" else v
                                              for k, v in flax.traverse_util.flatten_dict(params).items()})
  batch = {k: np.asarray(v) for k, v in random_batch(2, 8, seed=4).items() if k in SOURCE_KEYS}
  translator = decode.Translator(cfg, params, beam_size=4, max_len=7)
  step_fn, state = translator.step(params, batch)
  run = jax.jit(lambda tokens, live: step_fn(tokens, 1, state, live)[0])
  live = np.array([1, 0, 1, 1, 0, 1, 0, 0], bool)  # e.g. unopened beams and finished rows among the 2 x 4
  tokens = np.arange(8, dtype=np.int32) + 5
  other = np.where(live, tokens, np.arange(8) * 37 % 590 + 9).astype(np.int32)  # the same live rows
  np.testing.assert_allclose(run(tokens, live)[live], run(other, live)[live], rtol=1e-6, atol=1e-6)
  every = np.ones(8, bool)
  assert np.abs(run(tokens, every)[live] - run(other, every)[live]).max() > 1e-3


def recorded_live(step_fn, search):
  """The `live` masks `search(step_fn')` hands its steps, step by step ([steps, N] bool)."""
  seen = []

  def recording(tokens, i, cache, live):
    jax.debug.callback(lambda live: seen.append(np.asarray(live)), live, ordered=True)
    return step_fn(tokens, i, cache, live)

  jax.block_until_ready(jax.jit(lambda: search(recording))())
  return np.stack(seen)


def test_searches_route_neither_finished_rows_nor_unopened_beams():
  """Greedy: a row is live until it has emitted EOS. Beam search: at step 0 only each sentence's first beam is
  open (and at step 1 too, its first token forced), and a sentence whose best hypothesis is settled routes none."""
  B, K, T = 2, 3, 6
  table = np.full((2, V, T, V), -30.0, np.float32)  # [sentence, previous, position, token]
  table[0, :, :, EOS_ID] = 0.0  # sentence 0 ends at once (after its forced token)
  table[1, :, :, 5:8] = 0.0  # sentence 1 never ends
  log_probs = jax.nn.log_softmax(jnp.asarray(table))

  def step_fn(tokens, i, cache, live=None):
    return log_probs[jnp.arange(len(tokens)) * 2 // len(tokens), tokens, i], cache

  greedy = recorded_live(step_fn, lambda f: decode.greedy_search(f, {}, B, T))
  np.testing.assert_array_equal(greedy, [[1, 1]] + [[0, 1]] * (T - 1))  # row 0 ended at step 0
  forced = recorded_live(step_fn, lambda f: decode.greedy_search(f, {}, B, T, forced=(9,)))
  np.testing.assert_array_equal(forced, [[1, 1], [1, 1]] + [[0, 1]] * (T - 2))  # row 0 ended at step 1
  beams = recorded_live(step_fn, lambda f: decode.beam_search(f, {}, B, K, T, forced=(9,), n_best=1)[0])
  np.testing.assert_array_equal(beams[0], [1, 0, 0, 1, 0, 0])
  np.testing.assert_array_equal(beams[1], [1, 0, 0, 1, 0, 0])  # the forced token leaves one beam open
  # sentence 0 is settled once [9, EOS] has finished (step 1); sentence 1's three beams are open from step 2
  assert len(beams) == T and not beams[2:, :K].any() and beams[2:, K:].all()

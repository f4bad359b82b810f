"""The input pipeline: deterministic, resumable, per-process batches at the sampling rates; prefetching."""

import threading

import numpy as np
import pytest

from gshard_mt import config as config_lib
from gshard_mt.data import packing, pipeline, tokenizer
from tests.helpers import small_config


def test_batches_are_deterministic_and_resumable(data):
  config = small_config()
  a, b = data.train_batches(config), data.train_batches(config)
  first = [next(a) for _ in range(4)]
  b.set_state(a.state(2))
  for (i, x), (j, y) in zip(first[2:], [next(b) for _ in range(2)]):
    assert i == j
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  assert a.next_index == 4
  other_seed = small_config(**{"data.seed": 1})
  assert not np.array_equal(data.train_batches(other_seed).batch(0)["inputs"], first[0][1]["inputs"])
  with pytest.raises(ValueError, match="seed"):
    b.set_state({"seed": 99, "next_index": 0})


def test_batch_i_does_not_depend_on_what_was_read_before(data):
  config = small_config()
  fresh = data.train_batches(config).batch(5)
  used = data.train_batches(config)
  for i in (9, 0, 1, 2):
    used.batch(i)
  again = used.batch(5)
  for k in fresh:
    np.testing.assert_array_equal(fresh[k], again[k])


def test_each_process_builds_its_own_rows_of_the_same_global_batch(data):
  config = small_config()
  whole = data.train_batches(config).batch(3)
  parts = [data.train_batches(config, process_index=p, process_count=2).batch(3) for p in range(2)]
  assert parts[0]["inputs"].shape == (config.batch_size // 2, config.data.max_length)
  for key in whole:
    np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])
  with pytest.raises(ValueError, match="does not divide over 3 processes"):
    data.train_batches(config, process_index=0, process_count=3)


def test_target_rows_have_their_own_length(data):
  """data.max_target_length=16 (sources 24): target rows of 16 slots; pairs longer on either side are left out."""
  config = small_config(**{"data.max_target_length": 16})
  assert config_lib.row_lengths(config) == (24, 16) and config_lib.row_lengths(small_config()) == (24, 24)
  batches = data.train_batches(config)
  split = data.tokens["train"]
  assert batches.filtered == int(((split.src_len > 24) | (split.tgt_len > 16)).sum()) > 0
  long_targets = set(np.flatnonzero(split.tgt_len > 16).tolist())
  for i in range(10):
    b = batches.batch(i)
    assert b["inputs"].shape == (config.batch_size, 24) and b["targets"].shape == (config.batch_size, 16)
    for key in ("targets", "targets_segmentation", "targets_position"):
      assert b[key].shape == (config.batch_size, 16)
    pairs = ((b["inputs_position"] == 0) & (b["inputs_segmentation"] > 0)).sum()
    assert ((b["targets_position"] == 0) & (b["targets_segmentation"] > 0)).sum() == pairs
    assert (b["targets"] == tokenizer.SENTENCEPIECE_IDS.eos).sum() == pairs  # each target whole, up to its EOS
  assert not long_targets & set(batches.eligible.tolist())  # never sampled, so never cut at the row's end


@pytest.mark.parametrize("processes", [2, 4])
def test_windows_that_straddle_processes_give_the_same_global_batch(data, processes):
  split, seed = data.tokens["train"], small_config().data.seed

  def batch(p, count):  # windows of 3 rows: rows 0-2, 3-5, 6-7, split across processes at 4 (or 2, 4, 6)
    return pipeline.TrainBatches(split, data.rates, 8, (48, 36), seed, p, count, window_rows=3).batch(7)

  whole = batch(0, 1)
  parts = [batch(p, processes) for p in range(processes)]
  for key in whole:
    np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])


def test_a_window_reads_the_head_of_its_stream_and_packs_as_from_all_of_it(data):
  batches, split = data.train_batches(small_config()), data.tokens["train"]
  for index in range(30):
    stream = batches._stream(index, 0)
    ids = batches.eligible[stream]
    whole = packing.fill_rows(split.src_len[ids], split.tgt_len[ids], 8, batches.lengths)
    head, src_len, tgt_len = batches._head(stream, 8)
    assert len(whole) < len(head) < len(stream) / 2  # the stream is drawn for the worst case; its head is read
    np.testing.assert_array_equal(head, ids[:len(head)])
    np.testing.assert_array_equal(packing.fill_rows(src_len, tgt_len, 8, batches.lengths), whole)


def test_language_frequencies_follow_the_rates(data):
  config = small_config()
  batches = data.train_batches(config)
  split = data.tokens["train"]
  tag_to_lang = {data.tokenizer.tag_id(lang): i for i, lang in enumerate(split.languages)}
  counts = np.zeros(len(split.languages))
  for i in range(150):
    b = batches.batch(i)
    starts = (b["inputs_position"] == 0) & (b["inputs_segmentation"] > 0)
    for tag in b["inputs"][starts]:
      counts[tag_to_lang[int(tag)]] += 1
  expected = np.array([data.rates[lang] for lang in split.languages])
  observed = counts / counts.sum()
  # Packing takes a prefix of the sampled pairs whatever their lengths; 20% relative covers the sampling noise.
  np.testing.assert_allclose(observed, expected, rtol=0.2)


def test_a_draw_above_the_rates_rounded_sum_falls_in_the_last_sampled_stream(data, monkeypatch):
  """Rates 0.1 and 0.3 normalised sum to 1 - 2^-53, the largest draw there is: it belongs to the second stream, not
  to a stream of rate 0 after it (one past `eligible` when that stream is empty)."""
  split = data.tokens["train"]
  rates = {split.languages[0]: 0.1, split.languages[1]: 0.3}
  batches = pipeline.TrainBatches(split, rates, 8, (32, 32), seed=0)

  class LargestDraws:
    def random(self, n):
      return np.full(n, 1 - 2.0 ** -53)

  monkeypatch.setattr(pipeline.np.random, "default_rng", lambda seed: LargestDraws())
  stream = batches._stream(0, 0)
  assert ((stream >= batches.starts[1]) & (stream < batches.starts[1] + batches.counts[1])).all()


def test_prefetch_keeps_order_and_raises():
  assert list(pipeline.prefetch(iter(range(10)), 3, lambda x: x * 2)) == [2 * i for i in range(10)]

  def broken():
    yield 1
    raise RuntimeError("source failed")

  with pytest.raises(RuntimeError, match="source failed"):
    list(pipeline.prefetch(broken(), 2))


def test_prefetch_close_joins_its_thread():
  before = set(threading.enumerate())
  feed = pipeline.prefetch(iter(range(1000)), 2)
  assert next(feed) == 0
  assert len(set(threading.enumerate()) - before) == 1  # the producer, blocked on a full queue
  feed.close()
  assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]

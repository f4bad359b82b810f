"""Batch layouts: packed training rows and padded evaluation rows."""

import math

import numpy as np

from gshard_mt.data import packing, pipeline, tokenizer
from tests.helpers import small_config


def test_packed_batches_hold_whole_pairs(data):
  config = small_config()
  batches = data.train_batches(config)
  split = data.tokens["train"]
  batch = batches.batch(0)
  L = config.data.max_length
  assert all(v.shape == (config.batch_size, L) and v.dtype == np.int32 for v in batch.values())
  pairs = {(tuple(split.src_tokens[split.src_offsets[i]:split.src_offsets[i + 1]]),
            tuple(split.tgt_tokens[split.tgt_offsets[i]:split.tgt_offsets[i + 1]])) for i in range(len(split))}
  found = 0
  for r in range(config.batch_size):
    for seg in range(1, batch["inputs_segmentation"][r].max() + 1):
      src = batch["inputs"][r][batch["inputs_segmentation"][r] == seg]
      tgt = batch["targets"][r][batch["targets_segmentation"][r] == seg]
      assert (tuple(src), tuple(tgt)) in pairs
      np.testing.assert_array_equal(batch["inputs_position"][r][batch["inputs_segmentation"][r] == seg],
                                    np.arange(len(src)))
      assert src[-1] == tokenizer.EOS_ID and tgt[-1] == tokenizer.EOS_ID
      found += 1
  assert found > config.batch_size  # rows hold several pairs
  assert (batch["inputs"][batch["inputs_segmentation"] == 0] == 0).all()
  assert batches.packing_efficiency > 0.6


def test_eval_batches_are_padded_in_order(data):
  split = data.tokens["dev"]
  lang = "fra"
  ids = pipeline.language_ids(split, lang)
  np.testing.assert_array_equal(ids, np.flatnonzero(split.lang == split.languages.index(lang)))
  batches = list(pipeline.eval_batches(split, 16, 24, ids))
  assert len(batches) == math.ceil(len(ids) / 16)
  index = np.concatenate([b["index"] for b in batches])
  np.testing.assert_array_equal(index[index >= 0], ids)
  last = batches[-1]
  assert (last["inputs"][last["index"] < 0] == 0).all()
  row = batches[0]
  n = split.src_offsets[ids[0] + 1] - split.src_offsets[ids[0]]
  np.testing.assert_array_equal(row["inputs"][0, :min(n, 24)],
                                split.src_tokens[split.src_offsets[ids[0]]:split.src_offsets[ids[0]] + min(n, 24)])


def test_pad_truncates_but_keeps_eos():
  split = packing.TokenizedSplit.from_lists(["xx"], [0], [list(range(3, 40)) + [1]], [[5, 1]])
  batch = packing.pad(split, np.array([0]), 2, 10)
  assert batch["inputs"][0, -1] == tokenizer.EOS_ID and batch["inputs"][0, 0] == 3
  assert batch["index"].tolist() == [0, -1]

"""BLEU during training: the per-language dev sample, and the scores of its translations (with stand-in translators)."""

import types

import numpy as np
import pytest

from gshard_mt import config_files
from gshard_mt.data import packing
from gshard_mt.errors import ConfigError, DataError
from gshard_mt.training import checkpoint as checkpoint_lib
from gshard_mt.training import dev_eval, loop, validate
from tests.helpers import small_config


def fake_split(sizes: dict[str, int]) -> packing.TokenizedSplit:
  """A split with `sizes[lang]` pairs per language, interleaved (only the language of each pair matters here)."""
  languages = sorted(sizes)
  lang = np.concatenate([np.full(n, languages.index(code), np.int32) for code, n in sizes.items()])
  lang = np.random.default_rng(1).permutation(lang)
  empty = np.zeros(len(lang) + 1, np.int64)
  return packing.TokenizedSplit(languages, lang, np.zeros(0, np.int32), empty, np.zeros(0, np.int32), empty)


SIZES = {"fra": 40, "deu": 3, "kab": 1, "ell": 12, "spa": 25}


def test_sample_is_fixed_by_the_seed():
  split = fake_split(SIZES)
  a, b = (dev_eval.language_sample(split, list(SIZES), 4, 100, seed=0) for _ in range(2))
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  other = dev_eval.language_sample(split, list(SIZES), 4, 100, seed=1)
  assert any(not np.array_equal(a[k], other[k]) for k in a)


@pytest.mark.parametrize("per_language", [1, 2, 3, 8, 40, 500])
def test_sample_takes_the_same_number_of_every_language(per_language):
  split = fake_split(SIZES)
  sample = dev_eval.language_sample(split, list(SIZES), per_language, 10**6, seed=0)
  assert sorted(sample) == sorted(SIZES)
  for lang, positions in sample.items():  # distinct, sorted positions among the language's pairs
    assert len(positions) == min(per_language, SIZES[lang])
    assert np.all(np.diff(positions) > 0) and positions[-1] < SIZES[lang]


@pytest.mark.parametrize("max_sentences,languages", [(1, 1), (7, 1), (8, 2), (15, 3), (16, 5), (10**6, 5)])
def test_a_cap_leaves_whole_languages_out(max_sentences, languages):
  """4 of each language would be 4 + 3 + 1 + 4 + 4 = 16 pairs: a cap below that keeps max_sentences // 4 languages
  (at least one), each with all of its sampled pairs, and the same pairs as without the cap."""
  split = fake_split(SIZES)
  full = dev_eval.language_sample(split, list(SIZES), 4, 10**6, seed=0)
  sample = dev_eval.language_sample(split, list(SIZES), 4, max_sentences, seed=0)
  assert len(sample) == languages
  assert all(np.array_equal(positions, full[lang]) for lang, positions in sample.items())


def test_sample_skips_languages_without_pairs():
  split = fake_split({"fra": 5, "deu": 0})
  assert list(dev_eval.language_sample(split, ["fra", "deu"], 10, 100, seed=0)) == ["fra"]


class EchoTranslator:
  """Outputs each pair's reference target tokens, or (shift=1) those of the next pair of the split."""

  def __init__(self, split: packing.TokenizedSplit, shift: int = 0):
    self.split, self.shift, self.rows = split, shift, []

  def by_pair(self, batch):
    self.rows.append(len(batch["index"]))
    out = {}
    for pair in batch["index"]:
      if pair >= 0:
        j = (pair + self.shift) % len(self.split)
        out[int(pair)] = self.split.tgt_tokens[self.split.tgt_offsets[j]:self.split.tgt_offsets[j + 1]].tolist()
    return out


def test_bleu_of_the_references_is_100_and_of_other_sentences_low(data):
  dev = data.tokens["dev"]
  sample = dev_eval.language_sample(dev, list(data.text["dev"]), 3, 100, seed=0)
  perfect = EchoTranslator(dev)
  scores = dev_eval.evaluate_bleu(perfect, data, sample, rows=8, max_length=24)
  assert scores["dev_bleu_greedy"] == pytest.approx(100.0) and scores["dev_chrf_greedy"] == pytest.approx(100.0)
  assert scores["dev_bleu_sentences"] == 15 and perfect.rows == [8, 8]
  assert scores["dev_bleu_languages"] == 5 and scores["dev_bleu_per_language"] == 3
  # Each language's references line up with its own pairs: another pair's target scores far lower.
  wrong = dev_eval.evaluate_bleu(EchoTranslator(dev, shift=1), data, sample, rows=8, max_length=24)
  assert wrong["dev_bleu_greedy"] < 30 and wrong["dev_chrf_greedy"] < 50


def test_bad_bleu_keys_are_config_errors():
  with pytest.raises(ConfigError, match="eval_bleu_every=-1: expected an integer >= 0"):
    small_config(eval_bleu_every=-1)
  with pytest.raises(ConfigError, match="eval_bleu_sentences=0: expected a positive integer"):
    small_config(eval_bleu_sentences=0)
  with pytest.raises(ConfigError, match="eval_bleu_per_language=0: expected a positive integer"):
    small_config(eval_bleu_per_language=0)


def test_a_run_that_failed_before_its_first_checkpoint_starts_again_changed(tmp_path):
  """A wrong data.path fails before any step and writes no config.json (the file is written once the state is
  restored or initialised); the corrected command is the same run, not one 'written for a different run'. Once a
  checkpoint exists, the config.json protects it."""
  workdir = tmp_path / "run"
  config_files.save(small_config(**{"data.source": "folder", "data.path": str(tmp_path / "first")}), workdir)
  for path in (tmp_path / "empty", tmp_path / "missing"):
    (tmp_path / "empty").mkdir(exist_ok=True)
    with pytest.raises(DataError):
      loop.prepare(small_config(**{"data.source": "folder", "data.path": str(path)}), workdir)
  assert validate.load_saved(workdir).data.path == str(tmp_path / "first")
  (workdir / checkpoint_lib.FOLDER / "3").mkdir(parents=True)
  with pytest.raises(ConfigError, match="written for a different run: data.path"):
    loop.prepare(small_config(**{"data.source": "folder", "data.path": str(tmp_path)}), workdir)


def test_the_dev_loss_takes_every_dev_pair_that_fits_the_training_rows_whole(data):
  """Each pair whose sides fit (max_length, max_target_length) lies whole in a row of those lengths, once; a longer
  one is left out rather than cut and scored against an EOS its reference lacks."""
  config = small_config(**{"data.max_length": 12, "data.max_target_length": 8, "batch_size": 16})
  dev = data.tokens["dev"]
  side = lambda tokens, offsets, k: tokens[offsets[k]:offsets[k + 1]].tolist()  # noqa: E731
  fits = {k for k in range(len(dev)) if len(side(dev.src_tokens, dev.src_offsets, k)) <= 12
          and len(side(dev.tgt_tokens, dev.tgt_offsets, k)) <= 8}
  assert 0 < len(fits) < len(dev)
  seen = []
  for batch in dev_eval.loss_batches(dev, config):
    assert batch["inputs"].shape == (16, 12) and batch["targets"].shape == (16, 8)
    for row, k in enumerate(batch["index"]):
      if k >= 0:
        seen.append(int(k))
        for field, tokens, offsets in (("inputs", dev.src_tokens, dev.src_offsets),
                                       ("targets", dev.tgt_tokens, dev.tgt_offsets)):
          real = batch[f"{field}_segmentation"][row] > 0
          assert batch[field][row][real].tolist() == side(tokens, offsets, k)
  assert sorted(seen) == sorted(fits)


def test_a_dev_loss_without_dev_pairs_is_refused_before_training():
  """data.min_eval_pairs=0 can leave the dev split empty: its loss would be 0.0, logged as if measured."""
  data = types.SimpleNamespace(tokens={"dev": fake_split({"fra": 0})}, text={"dev": {}})
  with pytest.raises(ConfigError, match="eval_every needs dev pairs that fit the training rows"):
    dev_eval.DevEvaluator(small_config(eval_every=5, eval_bleu_every=0), None, data, None)
  assert not dev_eval.DevEvaluator(small_config(eval_every=0, eval_bleu_every=0), None, data, None).due(5, True)

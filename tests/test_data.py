"""The data pipeline: sources, splits, tokenizer, temperature sampling, packing, determinism, prefetch, errors."""

import gzip
import math

import numpy as np
import pytest

from gshard_mt.data import corpus, packing, pipeline, sampling, tokenizer
from gshard_mt.data.corpus import DataError
from conftest import small_config


@pytest.fixture(scope="module")
def shipped():
  return corpus.load_folder(corpus.SHIPPED / "tatoeba")


def test_shipped_corpus_is_complete(shipped):
  data, empty = shipped
  assert len(data) == 112 and empty == 0
  assert sum(len(p) for p in data.values()) == 88_877  # no duplicates in the shipped corpus
  assert (corpus.SHIPPED / "tatoeba" / "README.md").exists()


def test_split_is_deterministic_and_disjoint(shipped):
  data, _ = shipped
  a, b = corpus.split_corpus(data), corpus.split_corpus(data)
  for lang in ("fra", "kab", "tha", "yue"):
    pairs = {name: set(zip(a[name][lang].src, a[name][lang].tgt)) for name in corpus.SPLITS}
    assert not (pairs["train"] & pairs["dev"]) and not (pairs["train"] & pairs["test"])
    assert not (pairs["dev"] & pairs["test"])
    assert sum(len(p) for p in pairs.values()) == len(data[lang])
    assert a["test"][lang].src == b["test"][lang].src
    assert a["test"][lang].src == data[lang].src[-len(a["test"][lang]):]  # the last 10%
    assert len(a["dev"][lang]) >= 5 and len(a["test"][lang]) >= 5


def write_pair(folder, lang, src_lines, tgt_lines, gz=False):
  for side, lines in ((lang, src_lines), ("eng", tgt_lines)):
    path = folder / f"corpus.{lang}-eng.{side}{'.gz' if gz else ''}"
    raw = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(raw) if gz else raw)


def test_folder_source_skips_empty_lines_and_duplicates(tmp_path):
  write_pair(tmp_path, "xx", ["a", "", "b", "a"], ["A", "B", "", "A"])
  write_pair(tmp_path, "yy", ["c", "d"], ["C", "D"], gz=True)
  data, empty = corpus.load_folder(tmp_path)
  assert data["xx"].src == ["a"] and data["xx"].tgt == ["A"] and empty == 2
  assert data["yy"].src == ["c", "d"]


def test_tsv_source(tmp_path):
  path = tmp_path / "pairs.tsv"
  path.write_text("fra\tbonjour\thello\n\ndeu\thallo\thello\nfra\tmerci\tthanks\n")
  data, empty = corpus.load_tsv(path)
  assert data["fra"].src == ["bonjour", "merci"] and data["deu"].tgt == ["hello"] and empty == 1
  path.write_text("fra\tbonjour\thello\nfra\tonly two fields\n")
  with pytest.raises(DataError, match=r"pairs.tsv:2: expected 3 tab-separated fields"):
    corpus.load_tsv(path)


def test_bad_files_give_clear_errors(tmp_path):
  write_pair(tmp_path, "xx", ["a", "b"], ["A"])
  with pytest.raises(DataError, match=r"corpus.xx-eng.xx has 2 lines but .*corpus.xx-eng.eng has 1"):
    corpus.load_folder(tmp_path)
  (tmp_path / "corpus.xx-eng.eng").write_bytes(b"A\n\xff\xfeB\n")
  with pytest.raises(DataError, match=r"corpus.xx-eng.eng:2: invalid UTF-8"):
    corpus.load_folder(tmp_path)
  (tmp_path / "corpus.xx-eng.eng").unlink()
  with pytest.raises(DataError, match="no English side corpus.xx-eng.eng"):
    corpus.load_folder(tmp_path)
  with pytest.raises(DataError, match="data folder not found"):
    corpus.load_folder(tmp_path / "missing")
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(DataError, match="no `\\*.xx-eng.xx`"):
    corpus.load_folder(empty)
  with pytest.raises(DataError, match="file not found"):
    corpus.read_lines(tmp_path / "nope.txt")


def test_config_level_errors(tmp_path):
  with pytest.raises(DataError, match=r"unknown language code\(s\) \['zzz'\] in data.languages"):
    corpus.load_corpus(small_config(**{"data.languages": "fra,zzz"}).data)
  write_pair(tmp_path, "xx", [""] * 3, ["A"] * 3)
  with pytest.raises(DataError, match="xx has 0 usable pairs"):
    corpus.load_corpus(small_config(**{"data.source": "folder", "data.path": str(tmp_path),
                                       "data.languages": ""}).data)
  with pytest.raises(DataError, match="unknown TFDS dataset data.tfds_name='no_such_dataset_xyz'"):
    corpus.load_corpus(small_config(**{"data.source": "tfds", "data.tfds_name": "no_such_dataset_xyz",
                                       "data.tfds_data_dir": str(tmp_path), "data.languages": ""}).data)


def test_tfds_source_without_tensorflow(tmp_path):
  import tensorflow_datasets as tfds

  class TinyDeEnTranslate(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.Translation(languages=["de", "en"]))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples(30), "validation": self._generate_examples(4, "v"),
              "test": self._generate_examples(5, "t")}

    def _generate_examples(self, n, prefix=""):
      for i in range(n):
        yield f"{prefix}{i}", {"de": f"{prefix}hallo {i}", "en": f"{prefix}hello {i}"}

  TinyDeEnTranslate(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  splits, _ = corpus.load_corpus(small_config(**{"data.source": "tfds", "data.tfds_name": "tiny_de_en_translate",
                                                 "data.tfds_data_dir": str(tmp_path), "data.languages": ""}).data)
  assert len(splits["train"]["de"]) == 30 and len(splits["dev"]["de"]) == 4 and len(splits["test"]["de"]) == 5
  assert sorted(splits["test"]["de"].tgt) == sorted(f"thello {i}" for i in range(5))
  i = splits["train"]["de"].src.index("hallo 7")
  assert splits["train"]["de"].tgt[i] == "hello 7"


@pytest.fixture(scope="module")
def data(tmp_path_factory, tokenizer_dir):
  import shutil

  workdir = tmp_path_factory.mktemp("data")
  shutil.copytree(tokenizer_dir, workdir / "tokenizer")
  return pipeline.load(small_config(), workdir)


def test_tokenizer_is_cached_with_fixed_ids_and_tags(data, tokenizer_dir):
  tok = data.tokenizer
  assert tok.path.parent.name == "tokenizer" and tok.path.name.startswith("spm-600-")
  assert tok.sp.pad_id() == tokenizer.PAD_ID == 0 and tok.sp.eos_id() == tokenizer.EOS_ID == 1
  assert tok.sp.unk_id() == tokenizer.UNK_ID == 2
  ids = tok.encode(["Nous sommes de votre avis."], "fra")[0]
  assert ids[0] == tok.tag_id("fra") and ids[-1] == tokenizer.EOS_ID
  assert tok.decode(ids + [0, 0]) == "Nous sommes de votre avis."
  assert tok.tag_id("zzz") is None
  again = tokenizer.train_or_load(data.text["train"], tok.path.parents[1], 600, True)
  assert again.path == tok.path  # reused, not retrained
  assert list(tok.path.parent.glob("*-train-*.npz"))  # tokenized once, cached


def test_vocabulary_too_large_is_a_clear_error(tmp_path):
  tiny = {"xx": corpus.Pairs(["a b"] * 3, ["c d"] * 3)}
  with pytest.raises(DataError, match="data.vocab_size=500 is too large"):
    tokenizer.train_or_load(tiny, tmp_path, 500, False)


def test_temperature_rates():
  counts = {"a": 1000, "b": 100, "c": 10}
  assert sampling.temperature_rates(counts, 1.0) == pytest.approx({"a": 1000 / 1110, "b": 100 / 1110,
                                                                   "c": 10 / 1110})
  assert sampling.temperature_rates(counts, math.inf) == pytest.approx({k: 1 / 3 for k in counts})
  t5 = sampling.temperature_rates(counts, 5.0)
  w = {k: (v / 1110) ** 0.2 for k, v in counts.items()}
  assert t5 == pytest.approx({k: v / sum(w.values()) for k, v in w.items()})
  with pytest.raises(ValueError, match="data.temperature must be > 0"):
    sampling.temperature_rates(counts, 0.0)


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


def test_batches_are_deterministic_and_resumable(data):
  config = small_config()
  a, b = data.train_batches(config), data.train_batches(config)
  first = [next(a) for _ in range(4)]
  b.set_state({"seed": config.data.seed, "next_index": 2})
  for (i, x), (j, y) in zip(first[2:], [next(b) for _ in range(2)]):
    assert i == j
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  assert a.get_state() == {"seed": config.data.seed, "next_index": 4}
  other_seed = small_config(**{"data.seed": 1})
  assert not np.array_equal(data.train_batches(other_seed).batch(0)["inputs"], first[0][1]["inputs"])
  with pytest.raises(ValueError, match="seed"):
    b.set_state({"seed": 99, "next_index": 0})


def test_each_process_builds_its_own_rows_of_the_same_global_batch(data):
  config = small_config()
  whole = data.train_batches(config).batch(3)
  parts = [data.train_batches(config, process_index=p, process_count=2).batch(3) for p in range(2)]
  assert parts[0]["inputs"].shape == (config.batch_size // 2, config.data.max_length)
  for key in whole:
    np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])
  with pytest.raises(ValueError, match="does not divide over 3 processes"):
    data.train_batches(config, process_index=0, process_count=3)


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
  # Packing favours short pairs a little; within 20% relative of the temperature rates.
  np.testing.assert_allclose(observed, expected, rtol=0.2)


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


def test_prefetch_keeps_order_and_raises():
  assert list(pipeline.prefetch(iter(range(10)), 3, lambda x: x * 2)) == [2 * i for i in range(10)]

  def broken():
    yield 1
    raise RuntimeError("source failed")

  with pytest.raises(RuntimeError, match="source failed"):
    list(pipeline.prefetch(broken(), 2))

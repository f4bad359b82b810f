"""Corpus sources: the shipped Tatoeba-112 and Multi30k, folders, TSV, TFDS, splits, and their errors."""

import gzip

import pytest

from gshard_mt.data import corpus, sources
from gshard_mt.errors import ConfigError, DataError
from tests import tiny_tfds
from tests.helpers import small_config, started_as


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


def test_no_pairs_are_dropped_silently_where_two_files_share_a_language(tmp_path):
  """Two file pairs of one language, in one folder or in two sources of one kind, would be one stream holding only
  the later's pairs: refused, naming the files or the sources; two folders of different languages both count."""
  a, b = tmp_path / "a", tmp_path / "b"
  for folder, lang in ((a, "xx"), (b, "xx")):
    folder.mkdir()
    write_pair(folder, lang, ["one", "two"], ["One", "Two"])
  (b / "other.xx-eng.xx").write_text("three\n")
  (b / "other.xx-eng.eng").write_text("Three\n")
  with pytest.raises(DataError, match=r"other.xx-eng.xx: a second xx file pair beside corpus.xx-eng.xx"):
    corpus.folder_files(b)
  for name in ("other.xx-eng.xx", "other.xx-eng.eng"):
    (b / name).unlink()
  both = small_config(**{"data.source": f"folder:{a}+folder:{b}", "data.languages": "", "data.min_eval_pairs": 0,
                         "data.dev_fraction": 0.0, "data.test_fraction": 0.0})
  with pytest.raises(DataError, match=r"two 'folder' sources both have language 'xx'.*in one folder source"):
    sources.load_corpus(both.data)
  (b / "corpus.xx-eng.xx").rename(b / "corpus.yy-eng.yy")
  (b / "corpus.xx-eng.eng").rename(b / "corpus.yy-eng.eng")
  splits, _ = sources.load_corpus(both.data)
  assert {lang: p.src for lang, p in splits["train"].items()} == {"xx": ["one", "two"], "yy": ["one", "two"]}


@pytest.mark.parametrize("make, lister", [
    (False, "python -m gshard_mt.tools.inspect_data --config configs/tiny.py --config.seed=3"),
    (True, 'make inspect-data ARGS="--config.seed=3"')])
def test_an_unknown_language_names_the_command_that_lists_the_source_s(make, lister, monkeypatch):
  """The command is train.py's own, without the languages asked for and the work directory (nothing to train)."""
  started_as(monkeypatch, ["python", "train.py", "--config", "configs/tiny.py", "--workdir", "runs/x",
                           "--config.data.languages=fra,zzz", "--config.seed=3"], make=make)
  with pytest.raises(DataError) as raised:
    sources.load_corpus(small_config(**{"data.languages": "fra,zzz"}).data)
  assert str(raised.value) == ("unknown language code(s) ['zzz'] in data.languages: no file or stream of data.source "
                               f"has them ({lister} lists its languages)")


def test_config_level_errors(tmp_path):
  write_pair(tmp_path, "xx", [""] * 3, ["A"] * 3)
  with pytest.raises(DataError, match="xx has 0 usable pairs"):
    sources.load_corpus(small_config(**{"data.source": "folder", "data.path": str(tmp_path),
                                       "data.languages": ""}).data)
  with pytest.raises(DataError, match="^unknown TFDS dataset 'no_such_dataset_xyz' in data.tfds_data_dir=.*[^\n]$"):
    sources.load_corpus(small_config(**{"data.source": "tfds", "data.tfds_name": "no_such_dataset_xyz",
                                       "data.tfds_data_dir": str(tmp_path), "data.languages": ""}).data)


def test_tfds_datasets_without_tensorflow_one_stream_each(tmp_path):
  joined = tiny_tfds.build(tmp_path)  # tiny_de_en_translate + tiny_fr_en_translate, array_record
  for source in ({"data.source": "tfds", "data.tfds_name": "tiny_de_en_translate"}, {"data.source": joined}):
    config = small_config(**source, **{"data.tfds_data_dir": tmp_path, "data.languages": ""})
    splits, _ = sources.load_corpus(config.data)
    assert len(splits["train"]["de"]) == 30 and len(splits["dev"]["de"]) == 4 and len(splits["test"]["de"]) == 5
    assert sorted(splits["test"]["de"].tgt) == sorted(f"thello {i}" for i in range(5))
    i = splits["train"]["de"].src.index("hallo 7")
    assert splits["train"]["de"].tgt[i] == "hello 7"
  assert sorted(splits["train"]) == ["de", "fr"] and splits["train"]["fr"].origin == "tfds:tiny_fr_en_translate/train"
  i = splits["train"]["fr"].src.index("bonjour 3")
  assert splits["train"]["fr"].tgt[i] == "hello 3"
  for key in ("xx", "en"):  # a KeyError, or English to English
    config = small_config(**{"data.source": "tfds", "data.tfds_name": "tiny_de_en_translate", "data.languages": "",
                             "data.tfds_data_dir": tmp_path, "data.tfds_source_key": key})
    with pytest.raises(DataError, match=f"data.tfds_source_key='{key}': TFDS dataset 'tiny_de_en_translate' "
                                        r"translates \['de', 'en'\]"):
      sources.load_corpus(config.data)


MULTI30K = corpus.SHIPPED / "multi30k"


def raw(name):
  return gzip.open(MULTI30K / f"{name}.gz", "rt", encoding="utf-8").read().splitlines()


def test_multi30k_official_splits_are_kept():
  splits, _ = sources.load_corpus(small_config(**{"data.source": "multi30k", "data.languages": ""}).data)
  assert sorted(splits["test"]) == ["ces", "deu", "fra"]
  for code, lang in corpus.MULTI30K_LANGUAGES.items():
    assert splits["test"][lang].src == [s.strip() for s in raw(f"test_2016_flickr.{code}")]
    assert splits["test"][lang].tgt == [s.strip() for s in raw("test_2016_flickr.en")]
    assert splits["dev"][lang].src == [s.strip() for s in raw(f"val.{code}")]
    assert len(splits["train"][lang]) >= 28_990  # 29,000 lines less a few exact duplicates
  assert (MULTI30K / "README.md").exists()


def test_a_corrupt_gz_an_empty_or_missing_tsv_and_a_source_without_its_path_are_one_line_each(tmp_path):
  (tmp_path / "c.fra-eng.fra.gz").write_bytes(b"garbage")
  with pytest.raises(DataError, match=r"c.fra-eng.fra.gz: cannot decompress \(Not a gzipped file"):
    corpus.read_lines(tmp_path / "c.fra-eng.fra.gz")
  (tmp_path / "empty.tsv").write_text("")
  with pytest.raises(DataError, match=r"^data.source='tsv' \(data.path='.*empty.tsv'\): no training pairs$"):
    sources.load_corpus(small_config(**{"data.source": "tsv", "data.path": str(tmp_path / "empty.tsv"),
                                       "data.languages": ""}).data)
  with pytest.raises(DataError, match=r"missing.tsv: TSV file not found \(data.path\)"):
    sources.parts(small_config(**{"data.source": "tsv", "data.path": str(tmp_path / "missing.tsv")}).data)
  for source in ("folder", "tsv", "tatoeba+folder"):
    with pytest.raises(ConfigError, match=r"data.source='(folder|tsv)' reads data.path \(or '\w+:PATH'\)"):
      small_config(**{"data.source": source})
  small_config(**{"data.source": f"folder:{tmp_path}"})  # the path after the colon


def test_a_byte_order_mark_is_no_text(tmp_path):
  """Editors on Windows start UTF-8 files with U+FEFF: it made the first TSV row's language '\\ufeffdeu' (a stream
  of one pair) and went into the first folder pair's text."""
  (tmp_path / "pairs.tsv").write_bytes("\ufeffdeu\thallo\thello\ndeu\tja\tyes\n".encode())
  data, _ = corpus.load_tsv(tmp_path / "pairs.tsv")
  assert list(data) == ["deu"] and data["deu"].src == ["hallo", "ja"]
  write_pair(tmp_path, "xx", ["\ufeffa", "b"], ["A", "B"])
  assert corpus.load_folder(tmp_path)[0]["xx"].src == ["a", "b"]


def test_a_pair_file_the_folder_cannot_name_is_refused(tmp_path):
  """A region or upper-case code (pt_BR, POR) was skipped without a word: its pairs were left out of training."""
  write_pair(tmp_path, "deu", ["a"], ["A"])
  write_pair(tmp_path, "pt_BR", ["b"], ["B"])
  with pytest.raises(DataError, match=r"corpus.pt_BR-eng.(eng|pt_BR): not a `<prefix>.xx-eng.xx` .* e.g. por"):
    corpus.load_folder(tmp_path)


def test_a_tsv_language_left_out_is_not_split(tmp_path):
  """data.languages=deu on a file whose xyz has 3 pairs: xyz is too small to split, and is not wanted anyway."""
  path = tmp_path / "pairs.tsv"
  path.write_text("".join(f"deu\ts{i}\tt{i}\n" for i in range(30)) + "xyz\ta\tA\nxyz\tb\tB\nxyz\tc\tC\n")
  config = small_config(**{"data.source": "tsv", "data.path": str(path), "data.languages": "deu"})
  (part,) = sources.parts(config.data)
  splits, _ = part.source.read(part, sources.split_settings(config.data))
  assert list(splits["train"]) == ["deu"] and len(splits["test"]["deu"].src) == 5

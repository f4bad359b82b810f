"""Data sources (docs/config.md's data.source): each one class, registered by name in `SOURCES`; `data.source` names
one or several joined with '+', each with an argument after a colon if it takes one ('tfds:wmt19_translate/de-en').

A source lists the `Part`s it reads (one language's files, a TSV, a dataset), each read whole by one process of the
preparation (`gshard_mt.data.prepare`). A new source is a subclass of `Source` under `@SOURCES.register("name")`, in
any module imported before the config is read.
"""

from __future__ import annotations

import dataclasses
import os

from gshard_mt import io
from gshard_mt.data import corpus
from gshard_mt.data.corpus import SHIPPED, Corpus
from gshard_mt.errors import DataError
from gshard_mt.registry import Registry

SOURCES = Registry("data.source")  # classes; data.source is 'NAME' or 'NAME:ARG', several joined with '+'


@dataclasses.dataclass(frozen=True)
class Part:
  """A piece of the corpus that one process reads whole: `source` the class that reads it (pickled by name, for
  spawned processes), `args` what it needs (strings), `label` its source's name (in stream names: `corpus`)."""

  label: str
  source: type[Source]
  args: tuple[str, ...] = ()

  def key(self) -> tuple:  # in the prepared data's key (`gshard_mt.data.prepare.key`)
    return self.label, self.source.kind or self.label, self.args


class Source:
  """One kind of parallel text. `parts`: what to read for a data section (`arg`: what followed the colon in
  data.source); `files`: the files a part reads (their sizes and times key the prepared data); `read`: a part's
  splits {split: {language: Pairs}} and the empty lines it skipped (`settings`: `split_settings`)."""

  kind = ""  # how it reads, in the prepared data's key (as earlier versions named it); '': its label
  needs_path = False  # reads data.path (or what follows 'NAME:'); the config refuses it without one

  def __init__(self, name: str):
    self.name = name  # as data.source names it: the label of its parts

  def parts(self, data_config, arg: str, languages: set[str]) -> list[Part]:
    raise NotImplementedError

  @staticmethod
  def files(part: Part) -> list[io.epath.Path]:
    raise NotImplementedError

  @staticmethod
  def read(part: Part, settings: tuple[float, float, int]) -> tuple[dict[str, Corpus], int]:
    raise NotImplementedError


@SOURCES.register("folder")
class Folder(Source):
  """Line-aligned `*.xx-eng.xx` / `*.xx-eng.eng` files (plain or .gz) in data.path, one part per language, each
  split by `corpus.split_corpus`."""

  kind = "files"
  needs_path = True

  def folder(self, data_config, arg: str) -> str:
    return arg or data_config.path

  def parts(self, data_config, arg, languages):
    files = corpus.folder_files(self.folder(data_config, arg))
    return [Part(self.name, type(self), (lang, os.fspath(s), os.fspath(t))) for lang, (s, t) in files.items()
            if not languages or lang in languages]

  @staticmethod
  def files(part):
    return [io.path(p) for p in part.args[1:]]

  @staticmethod
  def read(part, settings):
    lang, src_path, tgt_path = part.args
    pairs, empty = corpus.aligned(src_path, tgt_path)
    return corpus.split_corpus({lang: pairs}, *settings), empty


@SOURCES.register("tatoeba")
class Tatoeba(Folder):
  """The shipped Tatoeba-112 corpus in data/tatoeba (112 languages to English, no download)."""

  needs_path = False

  def folder(self, data_config, arg):
    return SHIPPED / "tatoeba"


@SOURCES.register("tsv")
class Tsv(Source):
  """One `lang<TAB>source<TAB>english` file, data.path, split per language by `corpus.split_corpus`."""

  kind = "tsv"
  needs_path = True

  def parts(self, data_config, arg, languages):
    given = str(arg or data_config.path)  # as written: it keys the prepared data
    if not io.path(given).is_file():
      raise DataError(f"{io.path(given)}: TSV file not found (data.path)")
    return [Part(self.name, type(self), (given, *sorted(languages)))]  # the languages wanted ('' = all)

  @staticmethod
  def files(part):
    return [io.path(part.args[0])]

  @staticmethod
  def read(part, settings):
    pairs, empty = corpus.load_tsv(part.args[0])
    wanted = set(part.args[1:])  # before splitting: a language left out may be too small to split
    return corpus.split_corpus({k: v for k, v in pairs.items() if not wanted or k in wanted}, *settings), empty


@SOURCES.register("multi30k")
class Multi30k(Source):
  """The shipped Multi30k task 1 in data/multi30k (deu, fra, ces to English), with its own splits."""

  kind = "multi30k"

  def parts(self, data_config, arg, languages):
    return [Part(self.name, type(self))]

  @staticmethod
  def files(part):
    return sorted(p for p in io.path(SHIPPED / "multi30k").iterdir() if p.is_file())

  @staticmethod
  def read(part, settings):
    return corpus.load_multi30k()


@SOURCES.register("tfds")
class Tfds(Source):
  """A TFDS translation dataset with a `Translation` feature: 'tfds:NAME', or 'tfds' with data.tfds_name (and
  data.tfds_source_key), its train/validation/test as train/dev/test. Read CHUNK records at a time through
  `tfds.data_source` (random access to array_record files: TensorFlow is not needed)."""

  kind = "tfds"
  CHUNK = 10_000

  def parts(self, data_config, arg, languages):
    if arg:
      return [Part(arg.split("/")[0].split(":")[0], type(self), (arg, data_config.tfds_data_dir, ""))]
    return [Part(self.name, type(self), (data_config.tfds_name, data_config.tfds_data_dir,
                                         data_config.tfds_source_key))]

  @staticmethod
  def builder(name: str, data_dir: str):
    """The TFDS builder of `name` ('wmt19_translate/de-en') under `data_dir` ('' = TFDS's default)."""
    import tensorflow_datasets as tfds  # optional: TensorFlow Datasets, slow to import, only for data.source=tfds

    try:
      return tfds.builder(name, data_dir=data_dir or None)
    except Exception as e:  # noqa: BLE001 - TFDS raises several kinds for unknown names
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise DataError(f"unknown TFDS dataset {name!r} in data.tfds_data_dir={data_dir!r} (data.source, "
                      f"data.tfds_name): {first}") from None

  @staticmethod
  def files(part):
    return sorted(p for p in io.path(Tfds.builder(*part.args[:2]).data_path).iterdir() if p.is_file())

  @staticmethod
  def read(part, settings):
    import tensorflow_datasets as tfds  # optional: as in `builder`

    name, data_dir, source_key = part.args
    info = Tfds.builder(name, data_dir).info
    languages = list(getattr(info.features, "languages", None) or [])
    if "en" not in languages or len(languages) != 2:
      raise DataError(f"TFDS dataset {name!r} needs a Translation feature with 'en' and one source language, got "
                      f"languages {languages}")
    lang = source_key or next(lang for lang in languages if lang != "en")
    if lang not in languages or lang == "en":
      raise DataError(f"data.tfds_source_key={lang!r}: TFDS dataset {name!r} translates {languages}; the source "
                      "is the one that is not 'en' ('' picks it)")
    splits, empty = {}, 0
    for ours, theirs in (("train", "train"), ("dev", "validation"), ("test", "test")):
      if theirs not in info.splits:
        raise DataError(f"TFDS dataset {name!r} has no {theirs!r} split (has {list(info.splits)})")
      source = tfds.data_source(name, split=theirs, data_dir=data_dir or None)
      src, tgt = [], []
      for start in range(0, len(source), Tfds.CHUNK):
        for r in source.__getitems__(range(start, min(start + Tfds.CHUNK, len(source)))):
          src.append(r[lang].decode("utf-8"))
          tgt.append(r["en"].decode("utf-8"))
      pairs, skipped = corpus.clean(src, tgt, f"tfds:{name}/{theirs}")
      splits[ours], empty = {lang: pairs}, empty + skipped
    return splits, empty


def parts(data_config) -> list[Part]:
  """What `data.source` reads, in order ('NAME' or 'NAME:ARG' joined with '+': the data section checks the names);
  language files outside `data.languages` are left out unread."""
  wanted = {corpus.language_of(w) for w in corpus.wanted_streams(data_config.languages)}
  return [part for name, _, arg in (s.partition(":") for s in data_config.source.split("+"))
          for part in SOURCES.get(name)(name).parts(data_config, arg, wanted)]


def split_settings(data_config) -> tuple[float, float, int]:
  """(dev_fraction, test_fraction, min_eval_pairs): how `corpus.split_corpus` splits files and TSVs."""
  return data_config.dev_fraction, data_config.test_fraction, data_config.min_eval_pairs


def check_training_pairs(count: int, data_config):
  """A DataError naming data.source (and data.path) when the corpus read has no training pairs."""
  if count == 0:
    where = f" (data.path={data_config.path!r})" if data_config.path else ""
    raise DataError(f"data.source={data_config.source!r}{where}: no training pairs")


def load_corpus(data_config) -> tuple[dict[str, Corpus], dict]:
  """The configured source(s), split and filtered to `data.languages`, in memory; returns (splits, info)."""
  settings = split_settings(data_config)
  loaded = [(part.label, *part.source.read(part, settings)) for part in parts(data_config)]
  splits = corpus.by_stream([(label, found) for label, found, _ in loaded], data_config.languages)
  check_training_pairs(sum(len(p) for p in splits["train"].values()), data_config)
  return splits, {"empty_lines_skipped": sum(empty for _, _, empty in loaded)}

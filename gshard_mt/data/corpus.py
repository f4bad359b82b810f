"""Parallel text sources behind one interface: `load_corpus(config) -> {split: {lang: Pairs}}`.

Sources (config key `data.source`; join several with '+', e.g. 'tatoeba+multi30k'):
  'tatoeba'  the shipped Tatoeba-112 corpus in data/tatoeba (112 languages to English, no download);
  'multi30k' the shipped Multi30k task 1 in data/multi30k (deu, fra, ces to English), with its official splits:
             train, val as dev, test_2016_flickr as test;
  'folder'   any folder of line-aligned `*.xx-eng.xx` / `*.xx-eng.eng` files (plain or .gz), `data.path`;
  'tsv'      one file of `lang<TAB>source<TAB>english` lines, `data.path`;
  'tfds'     a TFDS translation dataset by name/config, `data.tfds_name` (read through `tfds.data_source`,
             so TensorFlow is not needed; the dataset must be prepared in array_record format).
Files and TSVs are split per language, deterministically (`split_corpus`); Multi30k and TFDS datasets keep their
own splits.

A corpus maps stream names to pairs. A stream is named by its language code, or `lang.source` where two joined
sources share the language ('deu.tatoeba', 'deu.multi30k'): each stream is sampled and scored on its own, and the
source-language tag is the language's (`language_of`), shared by its streams.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import pathlib
import re

from gshard_mt import io
from gshard_mt.errors import DataError

SPLITS = ("train", "dev", "test")
SOURCES = ("tatoeba", "multi30k", "folder", "tsv", "tfds")
SHIPPED = pathlib.Path(__file__).resolve().parents[2] / "data"
# Multi30k's files and language codes -> ours (ISO 639-3, as Tatoeba's).
MULTI30K_SPLITS = {"train": "train", "dev": "val", "test": "test_2016_flickr"}
MULTI30K_LANGUAGES = {"de": "deu", "fr": "fra", "cs": "ces"}
_PAIR_FILE = re.compile(r"^(?P<stem>.*\.)?(?P<src>[a-z]{2,3})-eng\.(?P<side>[a-z]{2,3})(?P<gz>\.gz)?$")



@dataclasses.dataclass
class Pairs:
  """Line-aligned source and English sentences of one language, with where they came from."""

  src: list[str]
  tgt: list[str]
  origin: str = ""

  def __len__(self):
    return len(self.src)


Corpus = dict[str, Pairs]  # stream name (language code, or lang.source) -> pairs


def language_of(stream: str) -> str:
  """The language code of a stream name: 'deu.multi30k' -> 'deu'."""
  return stream.split(".", 1)[0]


def read_lines(path: io.PathLike) -> tuple[list[str], int]:
  """Lines of a UTF-8 text file (plain or .gz), without newlines; returns (lines, number of empty lines)."""
  path = io.path(path)
  if not path.is_file():
    raise DataError(f"{path}: file not found")
  raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
  lines = raw.split(b"\n")
  if lines and lines[-1] == b"":
    lines.pop()
  out = []
  for number, line in enumerate(lines, start=1):
    try:
      out.append(line.decode("utf-8").rstrip("\r"))
    except UnicodeDecodeError as e:
      raise DataError(f"{path}:{number}: invalid UTF-8 ({e.reason} at byte {e.start})") from None
  return out, sum(1 for line in out if not line.strip())


def _aligned(src_path, tgt_path, lang) -> tuple[Pairs, int]:
  src, _ = read_lines(src_path)
  tgt, _ = read_lines(tgt_path)
  if len(src) != len(tgt):
    raise DataError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: "
                    "source and target files must be line-aligned")
  return _clean(src, tgt, f"{src_path}")


def _clean(src, tgt, origin) -> tuple[Pairs, int]:
  """Drops pairs with an empty side (counted) and exact duplicate pairs (so no pair lands in two splits)."""
  seen, keep_src, keep_tgt, empty = set(), [], [], 0
  for s, t in zip(src, tgt):
    s, t = s.strip(), t.strip()
    if not s or not t:
      empty += 1
    elif (s, t) not in seen:
      seen.add((s, t))
      keep_src.append(s)
      keep_tgt.append(t)
  return Pairs(keep_src, keep_tgt, origin), empty


def load_folder(path: io.PathLike) -> tuple[Corpus, int]:
  """All `<prefix>.xx-eng.xx` + `<prefix>.xx-eng.eng` pairs in `path`; returns (corpus, empty lines skipped)."""
  folder = io.path(path)
  if not folder.is_dir():
    raise DataError(f"{folder}: data folder not found (data.path)")
  corpus, empty = {}, 0
  for src_path in sorted(folder.iterdir()):
    m = _PAIR_FILE.match(src_path.name)
    if not m or m["side"] != m["src"] or m["src"] == "eng":
      continue
    tgt_path = src_path.with_name(src_path.name.replace(f"-eng.{m['src']}", "-eng.eng"))
    if not tgt_path.exists():
      raise DataError(f"{src_path}: no English side {tgt_path.name} beside it")
    corpus[m["src"]], n = _aligned(src_path, tgt_path, m["src"])
    empty += n
  if not corpus:
    raise DataError(f"{folder}: no `*.xx-eng.xx` / `*.xx-eng.eng` file pairs found")
  return corpus, empty


def load_tsv(path: io.PathLike) -> tuple[Corpus, int]:
  """A `lang<TAB>source<TAB>english` file; returns (corpus, empty lines skipped)."""
  lines, _ = read_lines(path)
  by_lang: dict[str, tuple[list, list]] = {}
  empty = 0
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      empty += 1
      continue
    fields = line.split("\t")
    if len(fields) != 3:
      raise DataError(f"{path}:{number}: expected 3 tab-separated fields (lang, source, english), "
                      f"got {len(fields)}")
    src, tgt = by_lang.setdefault(fields[0].strip(), ([], []))
    src.append(fields[1])
    tgt.append(fields[2])
  corpus = {}
  for lang, (src, tgt) in sorted(by_lang.items()):
    corpus[lang], n = _clean(src, tgt, f"{path} ({lang})")
    empty += n
  return corpus, empty


def split_corpus(corpus: Corpus, dev_fraction=0.1, test_fraction=0.1, min_eval=5) -> dict[str, Corpus]:
  """Per language: the last `test_fraction` (at least `min_eval`) pairs are test, the ones before them dev."""
  splits = {name: {} for name in SPLITS}
  for lang, pairs in corpus.items():
    n = len(pairs)
    n_test = max(min_eval, round(n * test_fraction))
    n_dev = max(min_eval, round(n * dev_fraction))
    if n - n_test - n_dev < 1:
      raise DataError(f"{pairs.origin}: {lang} has {n} usable pairs, too few for {n_dev} dev + {n_test} test "
                      "pairs and a training set")
    cut1, cut2 = n - n_test - n_dev, n - n_test
    for name, lo, hi in (("train", 0, cut1), ("dev", cut1, cut2), ("test", cut2, n)):
      splits[name][lang] = Pairs(pairs.src[lo:hi], pairs.tgt[lo:hi], pairs.origin)
  return splits


def load_tfds(name: str, data_dir: str | None = None, source_key: str = "") -> dict[str, Corpus]:
  """A TFDS translation dataset with a `Translation` feature; its train/validation/test become train/dev/test."""
  import tensorflow_datasets as tfds  # imported here: only this source needs it

  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except Exception as e:  # noqa: BLE001 - TFDS raises several kinds for unknown names
    raise DataError(f"unknown TFDS dataset data.tfds_name={name!r}: {e}") from None
  languages = list(getattr(builder.info.features, "languages", None) or [])
  if "en" not in languages or len(languages) != 2:
    raise DataError(f"TFDS dataset {name!r} (data.tfds_name) needs a Translation feature with 'en' and one "
                    f"source language, got languages {languages}")
  src_key = source_key or next(lang for lang in languages if lang != "en")
  splits = {}
  for ours, theirs in (("train", "train"), ("dev", "validation"), ("test", "test")):
    if theirs not in builder.info.splits:
      raise DataError(f"TFDS dataset {name!r} has no {theirs!r} split (has {list(builder.info.splits)})")
    source = tfds.data_source(name, split=theirs, data_dir=data_dir)
    records = [source[i] for i in range(len(source))]
    src = [r[src_key].decode("utf-8") for r in records]
    tgt = [r["en"].decode("utf-8") for r in records]
    splits[ours] = {src_key: _clean(src, tgt, f"tfds:{name}/{theirs}")[0]}
  return splits


def load_multi30k(folder: pathlib.Path = SHIPPED / "multi30k") -> dict[str, Corpus]:
  """Multi30k task 1 with its official splits (train, val -> dev, test_2016_flickr -> test), never re-split."""
  splits = {}
  for ours, theirs in MULTI30K_SPLITS.items():
    english, _ = read_lines(folder / f"{theirs}.en.gz")
    splits[ours] = {}
    for code, lang in MULTI30K_LANGUAGES.items():
      path = folder / f"{theirs}.{code}.gz"
      src, _ = read_lines(path)
      if len(src) != len(english):
        raise DataError(f"{path} has {len(src)} lines but {theirs}.en.gz has {len(english)}")
      splits[ours][lang], _ = _clean(src, english, str(path))
  return splits


def load_source(source: str, data_config) -> tuple[dict[str, Corpus], int]:
  """One source's splits; returns (splits, empty lines skipped)."""
  if source == "tfds":
    return load_tfds(data_config.tfds_name, data_config.tfds_data_dir or None, data_config.tfds_source_key), 0
  if source == "multi30k":
    return load_multi30k(), 0
  if source == "tsv":
    corpus, empty = load_tsv(data_config.path)
  elif source in ("tatoeba", "folder"):
    corpus, empty = load_folder(SHIPPED / "tatoeba" if source == "tatoeba" else data_config.path)
  else:
    raise DataError(f"unknown data.source {source!r}; expected one of {SOURCES}, or several joined with '+'")
  return split_corpus(corpus, data_config.dev_fraction, data_config.test_fraction, data_config.min_eval_pairs), empty


def join(parts: dict[str, dict[str, Corpus]]) -> dict[str, Corpus]:
  """{source: splits} -> one set of splits; a language two sources share becomes one stream per source."""
  count: dict[str, int] = {}
  for splits in parts.values():
    for lang in splits["train"]:
      count[lang] = count.get(lang, 0) + 1
  return {name: {(lang if count.get(lang, 0) < 2 else f"{lang}.{source}"): pairs
                 for source, splits in parts.items() for lang, pairs in splits[name].items()} for name in SPLITS}


def load_corpus(data_config) -> tuple[dict[str, Corpus], dict]:
  """The configured source(s), split and filtered to `data.languages`; returns (splits, info)."""
  sources = data_config.source.split("+")
  if len(set(sources)) != len(sources):
    raise DataError(f"data.source={data_config.source!r} names a source twice")
  loaded = {source: load_source(source, data_config) for source in sources}
  splits = join({source: s for source, (s, _) in loaded.items()})
  empty = sum(n for _, n in loaded.values())
  wanted = [lang.strip() for lang in data_config.languages.split(",") if lang.strip()]
  if wanted:
    streams = {w: [s for s in splits["train"] if w in (s, language_of(s))] for w in wanted}
    unknown = sorted(w for w, found in streams.items() if not found)
    if unknown:
      raise DataError(f"unknown language code(s) {unknown} in data.languages; the corpus has "
                      f"{sorted(splits['train'])}")
    chosen = sorted({s for found in streams.values() for s in found})
    splits = {name: {s: c[s] for s in chosen if s in c} for name, c in splits.items()}
  if sum(len(p) for p in splits["train"].values()) == 0:
    raise DataError(f"the {data_config.source} corpus has no training pairs")
  return splits, {"empty_lines_skipped": empty}


def fingerprint(corpus: Corpus) -> str:
  """A short hash of a corpus's content, for cache names."""
  h = hashlib.sha256()
  for lang in sorted(corpus):
    h.update(lang.encode())
    for s, t in zip(corpus[lang].src, corpus[lang].tgt):
      h.update(s.encode() + b"\t" + t.encode() + b"\n")
  return h.hexdigest()[:16]

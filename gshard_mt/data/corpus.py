"""Parallel text in memory: `Pairs` of one language, a corpus of streams, and how files, TSVs and Multi30k are read,
cleaned (empty lines and duplicate pairs dropped) and split. The sources that use them are in `sources`.

A corpus maps stream names to pairs. A stream is named by its language code, or `lang.source` where two joined
sources share the language ('deu.tatoeba', 'deu.multi30k'): each stream is sampled and scored on its own, and the
source-language tag is the language's (`language_of`), shared by its streams.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import pathlib
import re
import zlib
from collections.abc import Sequence

from gshard_mt import hints, io
from gshard_mt.errors import DataError

SPLITS = ("train", "dev", "test")
TARGET = "eng"  # every pair's target language: English
INSPECT = "gshard_mt.tools.inspect_data"  # the command that lists a config's languages
SHIPPED = pathlib.Path(__file__).resolve().parents[2] / "data"
# Multi30k's files and language codes -> ours (ISO 639-3, as Tatoeba's).
MULTI30K_SPLITS = {"train": "train", "dev": "val", "test": "test_2016_flickr"}
MULTI30K_LANGUAGES = {"de": "deu", "fr": "fra", "cs": "ces"}
_PAIR_FILE = re.compile(r"^(?P<stem>.*\.)?(?P<src>[a-z]{2,3})-eng\.(?P<side>[a-z]{2,3})(?P<gz>\.gz)?$")


@dataclasses.dataclass
class Pairs:
  """Line-aligned source and English sentences of one language, with where they came from (lists, or the
  memory-mapped `shards.Lines` of a prepared corpus)."""

  src: Sequence[str]
  tgt: Sequence[str]
  origin: str = ""

  def __len__(self):
    return len(self.src)


Corpus = dict[str, Pairs]  # stream name (language code, or lang.source) -> pairs


def language_of(stream: str) -> str:
  """The language code of a stream name: 'deu.multi30k' -> 'deu'."""
  return stream.split(".", 1)[0]


def read_lines(path: io.PathLike) -> list[str]:
  """Lines of a UTF-8 text file (plain or .gz), without newlines."""
  path = io.path(path)
  if not path.is_file():
    raise DataError(f"{path}: file not found")
  try:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
  except (OSError, EOFError, zlib.error) as e:  # a truncated or corrupt .gz
    raise DataError(f"{path}: cannot decompress ({e})") from None
  lines = raw.removeprefix(b"\xef\xbb\xbf").split(b"\n")  # a UTF-8 byte-order mark is no text
  if lines and lines[-1] == b"":
    lines.pop()
  out = []
  for number, line in enumerate(lines, start=1):
    try:
      out.append(line.decode("utf-8").rstrip("\r"))
    except UnicodeDecodeError as e:
      raise DataError(f"{path}:{number}: invalid UTF-8 ({e.reason} at byte {e.start})") from None
  return out


def aligned(src_path, tgt_path) -> tuple[Pairs, int]:
  """The cleaned pairs of two line-aligned files, and the empty pairs dropped."""
  src, tgt = read_lines(src_path), read_lines(tgt_path)
  if len(src) != len(tgt):
    raise DataError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: "
                    "source and target files must be line-aligned")
  return clean(src, tgt, str(src_path))


def clean(src, tgt, origin) -> tuple[Pairs, int]:
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


def folder_files(path: io.PathLike) -> dict[str, tuple[io.epath.Path, io.epath.Path]]:
  """{lang: (source file, English file)} for the `<prefix>.xx-eng.xx` + `<prefix>.xx-eng.eng` pairs in `path`."""
  folder = io.path(path)
  if not folder.is_dir():
    raise DataError(f"{folder}: data folder not found (data.path)")
  files = {}
  for src_path in sorted(folder.iterdir()):
    m = _PAIR_FILE.match(src_path.name)
    if not m and "-eng." in src_path.name:  # its pairs would be left out unsaid
      raise DataError(f"{src_path}: not a `<prefix>.xx-eng.xx` or `.xx-eng.eng` name (xx: 2-3 lower-case letters, "
                      "e.g. por, not pt_BR); rename it, or move it out of data.path")
    if not m or m["side"] != m["src"] or m["src"] == "eng":
      continue
    tgt_path = src_path.with_name(src_path.name.replace(f"-eng.{m['src']}", "-eng.eng"))
    if not tgt_path.exists():
      raise DataError(f"{src_path}: no English side {tgt_path.name} beside it")
    if m["src"] in files:  # one stream per language: a second pair would replace the first unread
      raise DataError(f"{src_path}: a second {m['src']} file pair beside {files[m['src']][0].name}; join them (one "
                      "pair of files per language in data.path)")
    files[m["src"]] = (src_path, tgt_path)
  if not files:
    raise DataError(f"{folder}: no `*.xx-eng.xx` / `*.xx-eng.eng` file pairs found")
  return files


def load_folder(path: io.PathLike) -> tuple[Corpus, int]:
  """All `<prefix>.xx-eng.xx` + `<prefix>.xx-eng.eng` pairs in `path`; returns (corpus, empty lines skipped)."""
  loaded = {lang: aligned(src_path, tgt_path) for lang, (src_path, tgt_path) in folder_files(path).items()}
  return {lang: pairs for lang, (pairs, _) in loaded.items()}, sum(empty for _, empty in loaded.values())


def load_tsv(path: io.PathLike) -> tuple[Corpus, int]:
  """A `lang<TAB>source<TAB>english` file; returns (corpus, empty lines skipped)."""
  by_lang: dict[str, tuple[list, list]] = {}
  empty = 0
  for number, line in enumerate(read_lines(path), start=1):
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
  cleaned = {lang: clean(src, tgt, f"{path} ({lang})") for lang, (src, tgt) in sorted(by_lang.items())}
  return {lang: pairs for lang, (pairs, _) in cleaned.items()}, empty + sum(n for _, n in cleaned.values())


def split_corpus(corpus: Corpus, dev_fraction=0.1, test_fraction=0.1, min_eval=5) -> dict[str, Corpus]:
  """Per language: the last `test_fraction` (at least `min_eval`) pairs are test, the ones before them dev."""
  splits = {name: {} for name in SPLITS}
  for lang, pairs in corpus.items():
    n = len(pairs)
    n_test = max(min_eval, round(n * test_fraction))
    n_dev = max(min_eval, round(n * dev_fraction))
    cut1, cut2 = n - n_test - n_dev, n - n_test
    if cut1 < 1:
      raise DataError(f"{pairs.origin}: {lang} has {n} usable pairs, too few for {n_dev} dev + {n_test} test "
                      "pairs and a training set")
    for name, lo, hi in (("train", 0, cut1), ("dev", cut1, cut2), ("test", cut2, n)):
      splits[name][lang] = Pairs(pairs.src[lo:hi], pairs.tgt[lo:hi], pairs.origin)
  return splits


def load_multi30k() -> tuple[dict[str, Corpus], int]:
  """Multi30k task 1 with its official splits (train, val -> dev, test_2016_flickr -> test), never re-split;
  returns ({split: corpus}, empty lines skipped)."""
  folder = SHIPPED / "multi30k"
  read = {(ours, lang): aligned(folder / f"{theirs}.{code}.gz", folder / f"{theirs}.en.gz")
          for code, lang in MULTI30K_LANGUAGES.items() for ours, theirs in MULTI30K_SPLITS.items()}
  return ({ours: {lang: read[ours, lang][0] for lang in MULTI30K_LANGUAGES.values()} for ours in MULTI30K_SPLITS},
          sum(empty for _, empty in read.values()))


def wanted_streams(languages: str) -> list[str]:
  """The codes of `data.languages` ('' = all)."""
  return [lang.strip() for lang in languages.split(",") if lang.strip()]


def by_stream(found: list[tuple[str, dict[str, dict]]], languages: str) -> dict[str, dict]:
  """{split: {stream: value}} of [(source label, {split: {language: value}})], one per part: the streams, named by
  their language code or `lang.label` where several sources have it, that `data.languages` selects (a language
  code selects all of its streams; '' = all), in sorted order."""
  per_part = collections.Counter((label, lang) for label, splits in found for lang in set().union(*splits.values()))
  if twice := sorted(key for key, n in per_part.items() if n > 1):  # e.g. folder:A+folder:B, both with deu
    raise DataError(f"data.source: two {twice[0][0]!r} sources both have language {twice[0][1]!r} (their pairs "
                    f"would be one stream, the later's); put their files in one {twice[0][0]} source")
  keys = sorted(per_part)
  count = collections.Counter(lang for _, lang in keys)
  names = {key: key[1] if count[key[1]] < 2 else f"{key[1]}.{key[0]}" for key in keys}
  if len(set(names.values())) < len(names):
    raise DataError(f"data.source={'+'.join(sorted({label for label, _ in keys}))!r}: two sources give the same "
                    "stream names; join different datasets")
  wanted = wanted_streams(languages)
  unknown = sorted({w for w in wanted if not any(w in (s, language_of(s)) for s in names.values())})
  if unknown:  # the sources read the languages asked for only: the same config without them lists them all
    lister = hints.command({"--config.data.languages": None, "--workdir": None}, program=INSPECT, keep=True)
    raise DataError(f"unknown language code(s) {unknown} in data.languages: no file or stream of data.source "
                    f"has them ({lister} lists its languages)")
  chosen = sorted(s for s in names.values() if not wanted or s in wanted or language_of(s) in wanted)
  values = {split: {names[label, lang]: v for label, splits in found for lang, v in splits[split].items()}
            for split in SPLITS}
  return {split: {s: values[split][s] for s in chosen if s in values[split]} for split in SPLITS}

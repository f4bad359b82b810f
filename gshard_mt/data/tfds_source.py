"""TFDS translation datasets as corpus parts: read lazily, `chunk` records at a time, through `tfds.data_source`
(random access to array_record files: TensorFlow is not needed)."""

from __future__ import annotations

from gshard_mt.errors import DataError


def builder(name: str, data_dir: str):
  """The TFDS builder of `name` ('wmt19_translate/de-en') under `data_dir` ('' = TFDS's default)."""
  import tensorflow_datasets as tfds  # optional: TensorFlow Datasets, slow to import, only for data.source=tfds

  try:
    return tfds.builder(name, data_dir=data_dir or None)
  except Exception as e:  # noqa: BLE001 - TFDS raises several kinds for unknown names
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise DataError(f"unknown TFDS dataset {name!r} in data.tfds_data_dir={data_dir!r} (data.source, "
                    f"data.tfds_name): {first}") from None


def load(name: str, data_dir: str = "", source_key: str = "", chunk: int = 10_000
         ) -> dict[str, tuple[str, list[str], list[str], str]]:
  """A TFDS translation dataset with a `Translation` feature: {split: (source language, sources, English
  sentences, origin)}, its train/validation/test as train/dev/test."""
  import tensorflow_datasets as tfds  # optional: as in `builder`

  info = builder(name, data_dir).info
  languages = list(getattr(info.features, "languages", None) or [])
  if "en" not in languages or len(languages) != 2:
    raise DataError(f"TFDS dataset {name!r} needs a Translation feature with 'en' and one source language, got "
                    f"languages {languages}")
  src_key = source_key or next(lang for lang in languages if lang != "en")
  splits = {}
  for ours, theirs in (("train", "train"), ("dev", "validation"), ("test", "test")):
    if theirs not in info.splits:
      raise DataError(f"TFDS dataset {name!r} has no {theirs!r} split (has {list(info.splits)})")
    source = tfds.data_source(name, split=theirs, data_dir=data_dir or None)
    src, tgt = [], []
    for start in range(0, len(source), chunk):
      for r in source.__getitems__(range(start, min(start + chunk, len(source)))):
        src.append(r[src_key].decode("utf-8"))
        tgt.append(r["en"].decode("utf-8"))
    splits[ours] = (src_key, src, tgt, f"tfds:{name}/{theirs}")
  return splits

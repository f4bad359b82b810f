"""The preparation of a corpus: read once, tokenized in parallel processes, written as memory-mappable shards.

  python -m gshard_mt.tools.prepare_data --config configs/tiny.py --workdir runs/tiny    (or make prepare)

A prepared directory (`gshard_mt.data.shards`) is named `spm-<V>-<key>`, the key hashing the corpus's files (names,
sizes, times) and every setting that changes what is prepared: runs with the same data and settings share one
preparation (`data.prepared_dir`), a changed file is prepared anew, and the key reads no corpus. A run keeps the
preparation it started with (`for_run`), whatever happens to the files after.
The steps, in a pool of processes (one per core) for a corpus of more than SERIAL_BELOW bytes:
  1. read: one process reads, cleans and splits each `sources.Part`, and stages its text;
  2. assemble: the streams are named and selected, and their text laid out split by split, streams sorted;
  3. tokenizer: data.tokenizer copied, else trained on the training pairs (a sample, seed 0, beyond MAX_SENTENCES);
  4. tokenize: chunks of CHUNK pairs are tokenized by the pool and appended in order.
A process holds one part or one chunk at a time: memory follows the largest language, not the corpus. The local
stage is published whole: renamed into place on a local disk, or uploaded to object storage with the manifest last
(the stage then serves as this host's local copy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import hashlib
import json
import logging
import multiprocessing
import os
import pathlib
import shutil
import socket
import tempfile
import time

import numpy as np

from gshard_mt import io
from gshard_mt.data import corpus, shards, sources, tokenizer_files
from gshard_mt.data import tokenizer as tokenizer_lib
from gshard_mt.errors import UserError, counted

log = logging.getLogger(__name__)

FORMAT = 1  # bump when what is prepared changes: older preparations are then not reused
CHUNK = 50_000  # pairs per tokenization task
SERIAL_BELOW = 32 << 20  # bytes of corpus files under which one process prepares (starting a pool costs seconds)
RUN_RECORD = "prepared.json"  # in a work directory: the name of the prepared directory its run trains on


def root(data_config, workdir: io.PathLike) -> io.epath.Path:
  """Where prepared directories live: data.prepared_dir, else <workdir>/tokenizer."""
  return io.path(data_config.prepared_dir or io.path(workdir) / "tokenizer")


def key(data_config) -> tuple[str, int]:
  """(the prepared directory's name `spm-<V>-<hash>`, bytes of the corpus's files), from the files' names, sizes
  and times (`io.stamp`) and the settings (a given tokenizer: the hash of its bytes in place of the trainer's
  settings); the corpus itself is not read."""
  parts = sources.parts(data_config)
  files = [(os.fspath(f), *io.stamp(f)) for part in parts for f in part.source.files(part)]
  settings = {"format": FORMAT, "parts": [p.key() for p in parts], "files": files,
              "languages": data_config.languages, "split": sources.split_settings(data_config),
              "source_tags": data_config.source_tags}
  if data_config.tokenizer:
    settings["tokenizer"] = tokenizer_files.digest(data_config.tokenizer)
  else:
    settings |= {"vocab_size": data_config.vocab_size, "character_coverage": data_config.character_coverage,
                 "trainer": tokenizer_lib.TRAINER_OPTIONS, "max_sentences": tokenizer_lib.MAX_SENTENCES}
  digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
  vocab = tokenizer_files.load(data_config.tokenizer).vocab_size if data_config.tokenizer else data_config.vocab_size
  return f"spm-{vocab}-{digest}", sum(size for _, size, _ in files)


def for_run(data_config, workdir: io.PathLike, *, record: bool = False) -> io.epath.Path:
  """The prepared directory of the run in `workdir`: the one its start recorded (RUN_RECORD) for the same data
  settings, even if its corpus files changed since (edited, or copied and cloned anew, which changes their times);
  else this config's (`ensure`), recorded with `record`."""
  path = io.path(workdir) / RUN_RECORD
  settings = {k: v for k, v in dataclasses.asdict(data_config).items() if k != "prefetch"}  # prefetch: not prepared
  kept = json.loads(path.read_text()) if path.exists() else {}
  if kept.get("data") == settings:
    target = root(data_config, workdir) / kept["name"]
    if shards.read_manifest(target) is not None:
      try:
        same_files = key(data_config)[0] == target.name
      except (UserError, OSError):  # files that are gone are no reason to stop
        same_files = False
      if not same_files:
        log.warning("the corpus files are not those %s was prepared from: the run keeps it (its tokenizer and "
                    "batches)", target)
      return target
    log.warning("%s, the prepared corpus of the run in %s, is gone: preparing the corpus again", target, workdir)
  target = ensure(data_config, workdir)
  if record:
    path.parent.mkdir(parents=True, exist_ok=True)
    io.write_atomically(path, json.dumps({"name": target.name, "data": settings}))
  return target


def ensure(data_config, workdir: io.PathLike, processes: int | None = None) -> io.epath.Path:
  """The prepared directory of this config's data, preparing it first when it is missing."""
  name, size = key(data_config)
  target = root(data_config, workdir) / name
  if shards.read_manifest(target) is None:
    stage = _stage(target)
    try:
      build(data_config, stage, processes or (1 if size < SERIAL_BELOW else os.cpu_count() or 1))
      _publish(stage, target)
    finally:
      shutil.rmtree(stage, ignore_errors=True)
  return target


def _stage(target: io.epath.Path) -> pathlib.Path:
  """A new local staging folder for `target`: beside it on a local disk (so that publishing is a rename), else in
  the system's temporary folder. Those of earlier preparations whose process is gone (killed) are removed."""
  folder = pathlib.Path(os.fspath(target.parent) if io.is_local(target) else tempfile.gettempdir())
  io.make_directory(folder, "directory of the prepared corpus")  # a path that cannot be one ends here, in one line
  here = socket.gethostname()  # a folder shared by hosts (NFS) holds their stages too: only this host's are judged
  for old in folder.glob(f".{target.name}.tmp*"):
    host, _, pid = old.name.rsplit(".tmp", 1)[1].lstrip(".").rpartition(".")  # '.HOST.PID' ('PID' before hosts)
    if (host or here) == here and pid.isdigit() and not _running(int(pid)):
      shutil.rmtree(old, ignore_errors=True)
  stage = folder / f".{target.name}.tmp.{here}.{os.getpid()}"
  shutil.rmtree(stage, ignore_errors=True)
  stage.mkdir()
  return stage


def _running(pid: int) -> bool:
  try:
    os.kill(pid, 0)  # no signal: only asks whether the process exists
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's
    pass
  return True


def build(data_config, stage: pathlib.Path, processes: int):
  """Steps 1-4 into the local folder `stage`, the manifest written last."""
  seconds, last = {}, [time.perf_counter()]

  def lap(step: str, done: str):  # each step says when it starts (log.info) and here how long it took
    now = time.perf_counter()
    seconds[step], last[0] = round(now - last[0], 2), now
    log.info("data: %s in %.1f s", done, seconds[step])

  log.info("data: preparing the corpus (once; %s reading and tokenizing): reading it",
           counted(processes, "process", "processes"))
  with _pool(processes) as run:
    splits, origins, empty = _read_and_assemble(data_config, stage, run)
    lap("read", f"read {sum(n for _, n in splits['train'])} train pairs")
    _tokenizer(data_config, stage, splits)
    lap("tokenizer", "copied the tokenizer" if data_config.tokenizer else "trained the tokenizer")
    log.info("data: tokenizing every split")
    dtype = shards.token_dtype(tokenizer_files.load(stage).vocab_size)
    writers = {(split, side): shards.RaggedWriter(shards.array_path(stage, split, f"{side}_tokens"),
                                                  shards.array_path(stage, split, f"{side}_offsets"))
               for split in splits for side in ("src", "tgt")}
    tasks = [(split, lo, min(lo + CHUNK, n)) for split, streams in splits.items()
             for n in [sum(count for _, count in streams)] for lo in range(0, n, CHUNK)]
    tokenize = functools.partial(_tokenize, stage=stage, streams={k: [s for s, _ in v] for k, v in splits.items()},
                                 dtype=dtype)
    for (split, _, _), sides in zip(tasks, run(tokenize, tasks)):
      for side, (tokens, lengths) in zip(("src", "tgt"), sides):
        writers[split, side].add(tokens, lengths)
    for writer in writers.values():
      writer.close()
    lap("tokenize", "tokenized")
  manifest = {"format": FORMAT, "splits": splits, "origins": origins, "token_dtype": dtype,
              "info": {"empty_lines_skipped": empty, "processes": processes, "seconds": seconds}}
  (stage / shards.MANIFEST).write_text(json.dumps(manifest, indent=1))
  log.info("prepared %d train pairs in %d streams with %s: %s", sum(n for _, n in splits["train"]),
           len(splits["train"]), counted(processes, "process", "processes"), seconds)


def _tokenizer(data_config, stage: pathlib.Path, splits: dict):
  """Step 3: the given tokenizer (data.tokenizer) copied into the stage, else one trained on the staged pairs."""
  if data_config.tokenizer:
    tokenizer_files.copy_into(data_config.tokenizer, stage)
    [tokenizer_files.load(stage).source_prefix(s) for s, _ in splits["train"]]  # an unknown language: said now
    return
  tags = tokenizer_lib.tag_pieces([s for s, _ in splits["train"]], data_config.source_tags)
  sentences = 2 * min(sum(n for _, n in splits["train"]), tokenizer_lib.MAX_SENTENCES // 2)
  model = tokenizer_lib.train_apart(functools.partial(_staged_sentences, stage, splits), sentences,
                                    data_config.vocab_size, tags, data_config.character_coverage)
  (stage / shards.MODEL).write_bytes(model)


def _read_and_assemble(data_config, stage: pathlib.Path, run) -> tuple[dict, dict, int]:
  """Steps 1 and 2, reading with `run` (a map); returns ({split: [[stream, pairs], ...]}, {stream: origin}, empty
  lines skipped)."""
  parts = sources.parts(data_config)
  read = functools.partial(_read_part, stage=stage, settings=sources.split_settings(data_config))
  found = list(run(read, list(enumerate(parts))))  # ({split: {lang: (part, lang, pairs, origin)}}, empty) per part
  streams = corpus.by_stream([(p.label, s) for p, (s, _) in zip(parts, found)], data_config.languages)
  splits = {split: [[s, n] for s, (_, _, n, _) in streams[split].items()] for split in corpus.SPLITS}
  sources.check_training_pairs(sum(n for _, n in splits["train"]), data_config)
  for split in corpus.SPLITS:
    _assemble(stage, split, list(streams[split].values()))
  origins = {s: origin for split in corpus.SPLITS for s, (*_, origin) in streams[split].items()}
  return splits, origins, sum(empty for _, empty in found)


@contextlib.contextmanager
def _pool(processes: int):
  """A map over a pool of `processes` new processes (spawned: the caller may be a threaded JAX program), in order;
  the built-in map for one."""
  if processes <= 1:
    yield map
    return
  with multiprocessing.get_context("spawn").Pool(processes) as pool:
    yield functools.partial(pool.imap, chunksize=1)


def _read_part(task: tuple[int, sources.Part], stage: pathlib.Path, settings) -> tuple[dict, int]:
  """Step 1 for part i (task: i, part): writes each (language, split)'s text to the stage; returns ({split: {lang:
  (i, lang, pairs, origin)}}, empty lines skipped)."""
  i, part = task
  splits, empty = part.source.read(part, settings)
  for split, languages in splits.items():
    for lang, pairs in languages.items():
      for side, lines in (("src", pairs.src), ("tgt", pairs.tgt)):
        encoded = [line.encode() for line in lines]
        writer = shards.RaggedWriter(*_staged(stage, i, lang, split, side))
        writer.add(np.frombuffer(b"".join(encoded), np.uint8), np.fromiter(map(len, encoded), np.int64))
        writer.close()
  return {split: {lang: (i, lang, len(p), p.origin) for lang, p in c.items()} for split, c in splits.items()}, empty


def _staged(stage: pathlib.Path, i: int, lang: str, split: str, side: str) -> tuple[pathlib.Path, pathlib.Path]:
  return stage / f"part{i}.{lang}.{split}.{side}_text", stage / f"part{i}.{lang}.{split}.{side}_text_offsets"


def _assemble(stage: pathlib.Path, split: str, streams: list[tuple[int, str, int, str]]):
  """Step 2 for one split: the staged text of `streams` [(part, lang, pairs, origin)] back to back, and `lang`."""
  with open(shards.array_path(stage, split, "lang"), "wb") as f:
    for index, (_, _, n, _) in enumerate(streams):
      f.write(np.full(n, index, np.int32).tobytes())
  for side in ("src", "tgt"):
    writer = shards.RaggedWriter(shards.array_path(stage, split, f"{side}_text"),
                                 shards.array_path(stage, split, f"{side}_text_offsets"))
    for i, lang, *_ in streams:
      text, offsets = _staged(stage, i, lang, split, side)
      with open(text, "rb") as f:  # streamed: one language's text may not fit in memory twice
        shutil.copyfileobj(f, writer.values, 1 << 24)
      ends = np.fromfile(offsets, np.int64)[1:]
      writer.offsets.write((writer.end + ends).tobytes())
      writer.end += int(ends[-1]) if len(ends) else 0
    writer.close()
  for path in stage.glob(f"part*.{split}.*"):
    path.unlink()


def _staged_sentences(stage: pathlib.Path, splits: dict):
  """`tokenizer.training_sentences` of the training pairs staged in `stage` (read in the tokenizer's own process)."""
  train = shards.open_text(stage, {"splits": splits, "origins": {}}, "train")
  return tokenizer_lib.training_sentences(list(train.values()))


def _tokenize(task: tuple[str, int, int], stage: pathlib.Path, streams: dict[str, list[str]], dtype: str):
  """Step 4 for pairs [lo, hi) of a split (task: split, lo, hi; streams: each split's, in order): ((source tokens,
  lengths), (target tokens, lengths))."""
  split, lo, hi = task
  tok = tokenizer_files.load(stage)
  read = lambda name: shards.read_array(shards.array_path(stage, split, name), shards.ARRAYS[name])
  src, tgt = (shards.Lines(read(f"{side}_text"), read(f"{side}_text_offsets"))[lo:hi] for side in ("src", "tgt"))
  lang = read("lang")[lo:hi]
  cuts = np.flatnonzero(np.diff(lang)) + 1  # where the stream changes
  runs = zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [hi - lo]]).tolist())
  pieces = [tok.encode_flat(src[a:b], streams[split][lang[a]], dtype) for a, b in runs]
  return ((np.concatenate([t for t, _ in pieces]), np.concatenate([n for _, n in pieces])),
          tok.encode_flat(tgt, corpus.TARGET, dtype, target=True))


def _publish(stage: pathlib.Path, target: io.epath.Path):
  """Moves a complete stage to `target` (see the module docstring); a preparation that finished first is kept."""
  if io.is_local(target):
    try:  # atomic: a rename onto a complete preparation fails, and none is removed (two runs may race here)
      os.rename(stage, os.fspath(target))
    except OSError as e:
      if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
        raise
      if shards.read_manifest(target) is not None:
        return  # another preparation of the same key finished first; its content is the same
      io.remove_tree(target)  # an incomplete directory (no manifest)
      os.rename(stage, os.fspath(target))
    return
  target.mkdir(parents=True, exist_ok=True)
  for path in sorted(stage.iterdir(), key=lambda p: p.name == shards.MANIFEST):
    with open(path, "rb") as src, (target / path.name).open("wb") as dst:
      shutil.copyfileobj(src, dst, 1 << 24)
  local = shards.local_path(target)
  if not (local / shards.MANIFEST).exists():
    local.parent.mkdir(parents=True, exist_ok=True)
    io.remove_tree(local)
    os.rename(stage, local)

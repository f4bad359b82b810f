"""Translation of arbitrary sentences with a trained work directory: one line in, its translation out, in order.

  python translate.py --workdir runs/tiny --src_lang fra < sentences.fra > sentences.eng
  printf 'fra\tJe suis content.\ndeu\tIch bin froh.\n' | python translate.py --workdir runs/tiny

Input lines are UTF-8 `text`, or `lang<TAB>text` when languages are mixed (--src_lang is then the language of the
lines without a tab). Decoding is eval.py's, so a sentence gets the same hypothesis from both. On several hosts
(`--config.distributed.*`) process 0 alone reads the input and writes the output; each decodes its rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO, TextIO

import jax
import numpy as np

from gshard_mt import hints, io
from gshard_mt.data import pipeline
from gshard_mt.data.corpus import language_of
from gshard_mt.data.packing import TokenizedSplit
from gshard_mt.errors import DataError, WorkdirError, close_matches, listed
from gshard_mt.evaluation import flags, report
from gshard_mt.evaluation.evaluate import Restored, check_decoding_length, restore
from gshard_mt.evaluation.outputs import standard_evaluations
from gshard_mt.model import decode
from gshard_mt.parallel import distributed
from gshard_mt.training import validate

WINDOW_BATCHES = 8  # batches of lines read ahead and sorted by length together (similar lengths decode together)


@dataclasses.dataclass(frozen=True)
class Line:
  """One input line: its number (from 1), source language (None: no tag) and text ('' when empty)."""

  number: int
  lang: str | None
  text: str


def source_languages(run: Restored) -> list[str]:
  """The source languages of a work directory: those of its training streams (each has a `<xx>` tag)."""
  return sorted({language_of(stream) for stream in run.data.tokens["train"].languages})


def quality_note(workdir) -> str | None:
  """`report.not_translating`'s line for the run's newest test BLEU (eval.py's), else for the greedy dev BLEU it
  logged last; None for a model that translates, or one without either."""
  workdir = io.path(workdir)
  if tests := standard_evaluations(workdir, "test"):
    step, path = max(tests.items())
    return report.not_translating(json.loads(path.read_text())["average"]["bleu"], f"{workdir}'s test BLEU at step "
                                  f"{step} (eval.py) is")
  logged = [row for row in io.read_jsonl(workdir / "metrics.jsonl") if row.get("dev_bleu_greedy") is not None]
  return report.not_translating(logged[-1]["dev_bleu_greedy"], f"{workdir}'s greedy dev BLEU at step "
                                f"{logged[-1]['step']} is") if logged else None


def languages_of(workdir) -> list[str]:
  """The source languages of a work directory's model (translate.py --list_languages), from its prepared corpus."""
  data = pipeline.load(validate.load_saved(workdir), workdir)
  return sorted({language_of(stream) for stream in data.tokens["train"].languages})


def known_languages(known: list[str], workdir) -> str:
  """The languages a model knows, as a message gives them: all, or their number and the command that lists them."""
  lister = hints.command({"--workdir": str(workdir), "--list_languages": True}, program="translate.py")
  return listed(known, "languages", lister)


def check_language(lang: str, known: list[str], where: str, workdir):
  """A WorkdirError naming `where`, the languages close to `lang` and the known ones unless the model knows it."""
  if lang not in known:
    raise WorkdirError(f"{where}: unknown source language {lang!r}; {close_matches([lang], known)}this model "
                       f"knows {known_languages(known, workdir)}")


def parse_line(raw: bytes, number: int, *, default: str | None, known: list[str], name: str = "<stdin>",
               tagged: bool = True, workdir: io.PathLike) -> Line:
  """One input line (`text` or `lang<TAB>text`), decoded, stripped as the corpus readers strip it, and checked:
  invalid UTF-8, an unknown language, or (with source tags) a non-empty line without one is an error naming
  `name:number`."""
  try:
    text = raw.rstrip(b"\n").rstrip(b"\r").decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(f"{name}:{number}: invalid UTF-8 ({e.reason} at byte {e.start})") from None
  tag, tab, rest = text.partition("\t")
  lang, text = (tag.strip(), rest) if tab else (default, text)
  where = f"{name}:{number}"
  if lang is not None:
    check_language(lang, known, where, workdir)
  text = text.strip()
  if text and lang is None and tagged:
    raise WorkdirError(f"{where}: no source language: start the line with 'lang<TAB>' or give --src_lang (this "
                       f"model knows {known_languages(known, workdir)})")
  return Line(number, lang, text)


class LineTranslator:
  """Translates parsed lines with eval.py's pieces (padded batches, `Translator.by_pair`); over-long lines are
  truncated to the model's maximum length, with a warning naming the line."""

  def __init__(self, run: Restored, translator: decode.Translator, rows: int, *, name: str = "<stdin>",
               warn: Callable[[str], None] = print):
    self.tokenizer, self.translator, self.rows = run.data.tokenizer, translator, rows
    self.max_length, self.name, self.warn = run.config.data.max_length, name, warn

  def encode(self, lines: list[Line]) -> list[list[int]]:
    """Token ids of each line (its source tag first, EOS last), warning about those over the maximum length."""
    ids: list[list[int]] = [[] for _ in lines]
    by_lang: dict[str | None, list[int]] = {}  # one tokenizer call per language
    for k, line in enumerate(lines):
      by_lang.setdefault(line.lang, []).append(k)
    for lang, ks in by_lang.items():
      for k, seq in zip(ks, self.tokenizer.encode([lines[k].text for k in ks], lang)):
        ids[k] = seq
    for line, seq in zip(lines, ids):
      if len(seq) > self.max_length:
        self.warn(f"{self.name}:{line.number}: {len(seq)} tokens, more than the model's maximum of "
                  f"{self.max_length} (data.max_length): truncated to the first {self.max_length}")
    return ids

  def batches(self, lines: list[Line]) -> Iterator[dict[int, str]]:
    """Yields, batch by batch, {position in `lines`: translation}; empty lines first, as empty translations.
    Similar lengths are batched together."""
    empty = {k: "" for k, line in enumerate(lines) if not line.text}
    if empty:
      yield empty
    todo = [k for k, line in enumerate(lines) if line.text]
    if not todo:
      return
    ids = self.encode([lines[k] for k in todo])
    split = TokenizedSplit.from_lists(["input"], np.zeros(len(ids)), ids, [[] for _ in ids])
    order = np.argsort(split.src_len, kind="stable")
    for batch in pipeline.eval_batches(split, self.rows, self.max_length, order):
      yield {todo[pair]: self.tokenizer.decode(seq) for pair, seq in self.translator.by_pair(batch).items()}


def translate_stream(raw_lines: Iterable[bytes], sink: TextIO, translator: LineTranslator, *, window: int,
                     parse: Callable[[bytes, int], Line]) -> int:
  """Translates `window` lines at a time into one line each, in input order, flushing after every batch (so it
  works in a pipe); returns the number of lines."""
  count = 0
  for chunk in itertools.batched(raw_lines, window):
    lines = [parse(raw, count + k + 1) for k, raw in enumerate(chunk)]  # the whole window is checked first
    count += len(lines)
    done: dict[int, str] = {}
    written = 0
    for result in translator.batches(lines):
      done.update(result)
      while written in done:
        sink.write(done.pop(written) + "\n")
        written += 1
      sink.flush()
  return count


def shared_lines(source: BinaryIO | None, window: int) -> Iterator[bytes]:
  """The lines of process 0's `source` (None elsewhere) on every process, read and sent `window` lines at a time; an
  empty chunk ends the input."""
  chunks = itertools.batched(iter(source.readline, b""), window) if source is not None else None
  while chunk := distributed.broadcast_object(next(chunks, ()) if chunks is not None else None):
    yield from chunk


@contextlib.contextmanager
def _opened(path: str | None, mode: str, default):
  if path is None:
    yield default
    return
  try:
    file = io.path(path).open(mode)  # text is UTF-8, with '\n' line ends
  except OSError as e:
    raise DataError(f"{path}: cannot open ({e.strerror})") from None
  with file:
    yield file


def translate(workdir, *, input_path: str | None = None, output_path: str | None = None, src_lang: str | None = None,
              step: int | None = None, average_last: int | None = None, beam_size: int = 4, alpha: float = 0.6,
              max_decode_len: int | None = None, batch_size: int | None = None,
              stdin: BinaryIO | None = None, stdout: TextIO | None = None) -> int:
  """translate.py: translates the lines of `input_path` (default: standard input) into `output_path` (default:
  standard output); returns the number of lines. From a terminal, each line is translated as it arrives."""
  flags.check(batch_size=batch_size, beam_size=beam_size, max_decode_len=max_decode_len, average_last=average_last)
  name = input_path or "<stdin>"
  main = jax.process_index() == 0
  with contextlib.ExitStack() as files:

    def open_input():  # process 0 alone reads the input: a file it cannot open stops every process
      if input_path is not None and not io.path(input_path).is_file():
        raise DataError(f"{input_path}: file not found (--input)")
      return files.enter_context(_opened(input_path, "rb", stdin or sys.stdin.buffer))

    source = distributed.checked_on_process_0(open_input)
    if output_path is not None:  # a folder that cannot hold the output is refused before the model is read
      distributed.checked_on_process_0(lambda: io.check_writable(io.path(output_path).parent, "output directory"))
    check_decoding_length(workdir, max_decode_len)  # before the model is read
    run = restore(workdir, step=step, average_last=average_last)
    known = source_languages(run)
    if src_lang is not None:
      check_language(src_lang, known, "--src_lang", workdir)
    if main and (note := quality_note(workdir)):
      print(f"note: {note}", file=sys.stderr, flush=True)
    interactive = distributed.broadcast_object(source is not None and source.isatty())
    rows = 1 if interactive else batch_size or run.config.batch_size
    translator = run.translator(beam_size, alpha, max_decode_len or run.config.data.max_length)
    warn = functools.partial(print, "warning:", file=sys.stderr, flush=True) if main else lambda message: None
    lines = LineTranslator(run, translator, rows, name=name, warn=warn)
    parse = functools.partial(parse_line, default=src_lang, known=known, name=name,
                              tagged=bool(run.config.data.source_tags) or run.data.tokenizer.tags_every_source,
                              workdir=workdir)
    if main and stdout is None and output_path is None:
      sys.stdout.reconfigure(encoding="utf-8", newline="\n")  # input is UTF-8, so is the output
    sink = distributed.checked_on_process_0(
        lambda: files.enter_context(_opened(output_path, "w", stdout or sys.stdout)))
    if sink is None:  # the other processes write nothing
      sink = files.enter_context(open(os.devnull, "w"))
    window = rows if interactive else rows * WINDOW_BATCHES
    return translate_stream(shared_lines(source, window), sink, lines, parse=parse, window=window)

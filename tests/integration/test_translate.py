"""translate.py and --average_last on a tiny trained work directory: checkpoint averaging, the same hypotheses as
eval.py, input order, empty and over-long lines, languages, and the error paths (one line, exit status 2)."""

import functools
import io
import os
import select
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from gshard_mt.data import pipeline
from gshard_mt.errors import DataError, WorkdirError
from gshard_mt.evaluation import evaluate
from gshard_mt.model import decode
from gshard_mt.tools import translate
from gshard_mt.training import loop
from tests.helpers import ROOT, small_config

FRA = ["Je suis content.", "Il fait très beau aujourd'hui, allons nous promener au parc.", "Merci !",
       "Où est la gare ?"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tokenizer_dir):
  """A tiny run with checkpoints at steps 3 and 6."""
  workdir = tmp_path_factory.mktemp("translate") / "run"
  shutil.copytree(tokenizer_dir, workdir / "tokenizer")
  loop.train_and_evaluate(small_config(num_train_steps=6, checkpoint_every=3, keep_checkpoints=3), workdir)
  return workdir


@pytest.fixture(scope="module")
def run(trained):
  return evaluate.restore(trained)


def run_script(workdir, *args, stdin: bytes):
  return subprocess.run([sys.executable, "translate.py", "--workdir", str(workdir), *args], input=stdin,
                        capture_output=True, timeout=600, cwd=ROOT)


def translate_text(workdir, text: str, **kwargs) -> list[str]:
  """translate.translate on `text` as standard input; the output lines."""
  out = io.StringIO()
  translate.translate(workdir, stdin=io.BytesIO(text.encode()), stdout=out, **kwargs)
  assert out.getvalue().endswith("\n") or not text
  return out.getvalue().split("\n")[:-1]


@pytest.mark.slow
def test_average_last_is_the_mean_of_the_checkpoints(trained):
  averaged = evaluate.restore(trained, average_last=2)
  assert averaged.averaged == (3, 6) and averaged.step == 6
  singles = [evaluate.restore(trained, step=s).params for s in (3, 6)]
  leaves = jax.tree.leaves(averaged.params)
  assert len(leaves) == len(jax.tree.leaves(singles[0]))
  for avg, a, b in zip(leaves, *map(jax.tree.leaves, singles)):
    assert avg.dtype == a.dtype
    np.testing.assert_allclose(np.asarray(avg), (np.asarray(a, np.float32) + np.asarray(b, np.float32)) / 2,
                               rtol=1e-6, atol=1e-7)
  assert not np.allclose(np.asarray(leaves[0]), np.asarray(jax.tree.leaves(singles[1])[0]))  # they did differ
  assert evaluate.restore(trained, step=3, average_last=1).averaged == (3,)
  with pytest.raises(WorkdirError, match=r"--average_last 3 needs 3 checkpoints, but .* has 2: \[3, 6\]"):
    evaluate.restore(trained, average_last=3)
  with pytest.raises(WorkdirError, match="has 1 up to step 3"):
    evaluate.restore(trained, step=3, average_last=2)
  scores = evaluate.evaluate(trained, split="test", beam_size=1, languages=["fra"], max_decode_len=6,
                             average_last=2)
  assert scores["decoding"]["averaged_steps"] == [3, 6] and scores["output_dir"].endswith("test-6-avg2-beam1-len6-fra")
  assert "averaged over steps [3, 6]" in (trained / "eval" / "test-6-avg2-beam1-len6-fra" / "report.md").read_text()


@pytest.mark.slow
def test_translate_gives_eval_hypotheses(trained, run):
  ids = pipeline.language_ids(run.data.tokens["test"], "fra")[:12]
  translator = decode.Translator(run.model_cfg, run.params, beam_size=2, alpha=0.6, max_len=10)
  hyp_by_id, _ = evaluate.decode_pairs(translator, run, split="test", ids=ids, rows=8, progress=False)
  sources = [run.data.text["test"]["fra"].src[int(i - ids[0])] for i in ids]  # the split holds fra in corpus order
  lines = translate_text(trained, "".join(s + "\n" for s in sources), src_lang="fra", beam_size=2,
                         max_decode_len=10, batch_size=8)
  assert lines == [hyp_by_id[int(i)] for i in ids]


class Echo:
  """A stand-in for decode.Translator: each row's translation is its source-tag piece and its source text."""

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer

  def by_pair(self, batch):
    out = {}
    for row, pair in zip(batch["inputs"], batch["index"]):
      if pair >= 0:
        seq = [int(t) for t in row if t]
        text = f"{self.tokenizer.sp.id_to_piece(seq[0])} {self.tokenizer.decode(seq)}"
        out[int(pair)] = self.tokenizer.sp.encode(text)
    return out


@pytest.mark.slow
def test_order_languages_empty_and_long_lines(run):
  """Mixed lengths and languages over several windows and batches come back in input order, each with its
  language's tag; empty lines give empty lines; an over-long line is truncated with a warning naming it."""
  long_line = " ".join(["bonjour"] * 60)
  raw = ["fra\tMerci !", "", FRA[3], "deu\tIch bin froh.", "  ", "ell\tΓεια",
         long_line, "spa\t", "Oui.", "kab\tAzul fell-awen a yimdukal"]
  warnings = []
  lines = translate.LineTranslator(run, Echo(run.data.tokenizer), rows=2, warn=warnings.append)
  parse = functools.partial(translate.parse_line, default="fra", known=translate.source_languages(run),
                            workdir=run.workdir)
  out = io.StringIO()
  count = translate.translate_stream(iter(line.encode() + b"\n" for line in raw), out, lines, window=4, parse=parse)
  got = out.getvalue().split("\n")[:-1]
  assert count == len(got) == len(raw)
  assert got[:6] == ["<fra> Merci !", "", f"<fra> {FRA[3]}", "<deu> Ich bin froh.",
                     "", "<ell> Γεια"]
  assert got[7:] == ["", "<fra> Oui.", "<kab> Azul fell-awen a yimdukal"]
  truncated = got[6].removeprefix("<fra> ")
  assert got[6].startswith("<fra> bonjour") and long_line.startswith(truncated) and len(truncated) < len(long_line)
  assert len(run.data.tokenizer.encode([truncated], "fra")[0]) <= run.config.data.max_length
  assert len(warnings) == 1 and "<stdin>:7:" in warnings[0] and "truncated" in warnings[0]


@pytest.mark.slow
def test_languages_checked_per_line(run):
  known = translate.source_languages(run)
  assert known == sorted(small_config().data.languages.split(","))
  parse = functools.partial(translate.parse_line, known=known, name="in.txt", workdir=run.workdir)
  assert parse(b"deu\tHallo\r\n", 3, default=None) == translate.Line(3, "deu", "Hallo")
  assert parse(b"\n", 4, default=None).text == ""  # no language needed for an empty line
  with pytest.raises(WorkdirError, match=r"in.txt:5: no source language: .*--src_lang .*deu, ell, fra"):
    parse(b"Bonjour\n", 5, default=None)
  with pytest.raises(WorkdirError, match=r"in.txt:6: unknown source language 'xx'; this model knows deu, ell"):
    parse(b"xx\tBonjour\n", 6, default="fra")
  with pytest.raises(DataError, match=r"in.txt:7: invalid UTF-8 \(invalid start byte at byte 3\)"):
    parse(b"ok \xff\n", 7, default="fra")


@pytest.mark.slow
def test_real_model_keeps_input_order(trained, tmp_path, capsys):
  """With the real model, the reversed input (read from --input, written to --output) gives the reversed output:
  other batches, the same translations. An over-long line is translated after a warning naming it."""
  text = ["fra\tMerci !", "", "deu\tIch bin froh.", FRA[1], " ".join(["bonjour"] * 60), "Où est la gare ?"]
  forward = translate_text(trained, "\n".join(text) + "\n", src_lang="fra", beam_size=2, max_decode_len=8,
                           batch_size=2)
  assert "warning: <stdin>:5: " in capsys.readouterr().err
  (tmp_path / "in.txt").write_text("\n".join(reversed(text)) + "\n")
  count = translate.translate(trained, input_path=str(tmp_path / "in.txt"), output_path=str(tmp_path / "out.txt"),
                              src_lang="fra", beam_size=2, max_decode_len=8, batch_size=2)
  backward = (tmp_path / "out.txt").read_text().split("\n")[:-1]
  assert count == len(forward) == len(backward) == len(text) and forward == backward[::-1] and forward[1] == ""
  assert f"warning: {tmp_path / 'in.txt'}:2: " in capsys.readouterr().err
  with pytest.raises(DataError, match="nothing.txt: file not found"):
    translate.translate(trained, input_path=str(tmp_path / "nothing.txt"))


@pytest.mark.slow
def test_script_pipe_prints_one_line(trained):
  proc = run_script(trained, "--src_lang", "fra", stdin=b"Je suis content.\n")
  assert proc.returncode == 0, proc.stderr.decode()[-2000:]
  assert len(proc.stdout.decode().splitlines()) == 1 and proc.stdout.decode().endswith("\n")


@pytest.mark.slow
def test_script_from_a_terminal_answers_each_line(trained):
  """From a terminal, each line is translated as it arrives, before the input ends."""
  pty = pytest.importorskip("pty")
  main, secondary = pty.openpty()
  proc = subprocess.Popen([sys.executable, "translate.py", "--workdir", str(trained), "--src_lang", "fra"],
                          stdin=secondary, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
  os.close(secondary)
  try:
    for sentence in ("Je suis content.", "Merci !"):
      os.write(main, sentence.encode() + b"\n")
      ready, _, _ = select.select([proc.stdout], [], [], 300)
      assert ready, "no translation before the end of the input"
      assert proc.stdout.readline().endswith(b"\n")
    os.write(main, b"\x04")  # end of input (Ctrl-D)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and out == b"", err.decode()[-2000:]
  finally:
    proc.kill()
    os.close(main)


def assert_one_line_error(proc, *needles):
  stderr = proc.stderr.decode()
  assert proc.returncode == 2, stderr[-2000:]
  assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr[-2000:]
  for needle in needles:
    assert needle in stderr, stderr


@pytest.mark.slow
def test_script_errors(trained):
  assert_one_line_error(run_script(trained, "--src_lang", "zzz", stdin=b"Bonjour\n"),
                        "translate.py: error: --src_lang: unknown source language 'zzz'", "deu, ell, fra, kab, spa")
  assert_one_line_error(run_script(trained, "--src_lang", "fra", stdin=b"Bonjour\nbad \xff byte\n"),
                        "<stdin>:2: invalid UTF-8")
  assert_one_line_error(run_script(trained, "--average_last", "5", stdin=b""), "needs 5 checkpoints", "has 2")

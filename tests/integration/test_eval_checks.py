"""eval.py's and translate.py's up-front checks: impossible flags refused in one line (exit 2) before anything is
loaded, the config overrides limited to the process layout, and an eval output directory that cannot be written or
a step without a checkpoint refused before the data is read."""

import argparse
import subprocess
import sys

import pytest

from gshard_mt import io
from gshard_mt.data import pipeline
from gshard_mt.errors import ConfigError, UserError, WorkdirError
from gshard_mt.evaluation import evaluate, flags
from tests.helpers import ROOT, initialised_run


@pytest.mark.parametrize("script, flag, value, minimum", [
    ("eval.py", "--beam_size", "0", 1), ("eval.py", "--max_decode_len", "-1", 1), ("eval.py", "--bootstrap", "-1", 0),
    ("translate.py", "--beam_size", "-1", 1)])
def test_flags_below_their_minimum_are_one_line(script, flag, value, minimum):
  # A work directory that does not exist: the flag is refused first.
  proc = subprocess.run([sys.executable, script, "--workdir", "/nonexistent/run", flag, value], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and proc.stderr == f"{script}: error: {flag} must be at least {minimum}, got {value}\n"


def test_parse_takes_only_the_process_layout():
  p = argparse.ArgumentParser()
  p.add_argument("--workdir")
  flags.add_decoding_flags(p, "decode")
  args, config = flags.parse(p, ["--workdir", "w", "--config.distributed.num_processes=2", "--beam_size", "3"])
  assert args.beam_size == 3 and config.distributed.num_processes == 2 and config.distributed.process_id == 0
  with pytest.raises(ConfigError, match=r"--config.model.emb_dim: only --config.distributed.\* may be given"):
    flags.parse(p, ["--workdir", "w", "--config.model.emb_dim=8"])
  with pytest.raises(UserError, match="--average_last must be at least 1, got 0"):
    flags.parse(p, ["--workdir", "w", "--average_last", "0"])
  for alpha in ("-2", "nan"):  # a reward for length, under which the early stop would miss the best hypothesis
    with pytest.raises(UserError, match=f"--alpha must be at least 0, got {float(alpha)}"):
      flags.parse(p, ["--workdir", "w", "--alpha", alpha])


@pytest.mark.slow
def test_eval_output_that_cannot_be_written_is_refused_before_reading_data(tmp_path, tokenizer_dir, monkeypatch):
  run = initialised_run(tmp_path / "run", tokenizer_dir)
  (run / "eval").write_text("a file where eval.py writes its directories")
  monkeypatch.setattr(pipeline, "load", lambda *a, **k: pytest.fail("read the data before the check"))
  with pytest.raises(io.PathFault) as caught:  # a storage fault: one line, exit 74
    evaluate.evaluate(run, split="test", languages=["fra"], beam_size=1)
  assert io.describe_fault(caught.value) == (f"{run}/eval: cannot create the eval output directory: {run}/eval is "
                                             "a file, not a directory")
  assert (run / "eval").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("average_last", [None, 1])
def test_a_step_without_a_checkpoint_is_refused_before_reading_data(tmp_path, tokenizer_dir, monkeypatch,
                                                                    average_last):
  run = initialised_run(tmp_path / "run", tokenizer_dir)
  monkeypatch.setattr(pipeline, "load", lambda *a, **k: pytest.fail("read the data before the check"))
  with pytest.raises(WorkdirError, match=r"no checkpoint for step 123 in .*/run/checkpoints \(have \[1\]\)"):
    evaluate.evaluate(run, split="test", step=123, beam_size=1, average_last=average_last)


def test_translate_output_that_cannot_be_written_is_refused_before_the_model_is_read(tmp_path):
  import io as std_io

  from gshard_mt.tools import translate

  (tmp_path / "notes").write_text("a file")
  # The work directory is not a run: reading it first would end with its ConfigError instead.
  with pytest.raises(io.PathFault, match="cannot create the output directory: .*/notes is a file, not a directory"):
    translate.translate(tmp_path / "nothing", output_path=str(tmp_path / "notes" / "out.txt"),
                        stdin=std_io.BytesIO(b"bonjour\n"))

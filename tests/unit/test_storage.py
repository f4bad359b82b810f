"""A work directory in object storage: what the config, data and picture code write at gs://bucket/run lands there
(tests/fake_storage.py serves the bucket from a local folder), and a scheme without its backend is one line."""

import errno
import importlib.util
import sys

import pytest

from gshard_mt import config as config_lib
from gshard_mt import io
from gshard_mt.data import packing, pipeline
from gshard_mt.errors import ConfigError, UserError
from gshard_mt.tools import plot, sweep
from tests.fake_storage import mapped_gs
from tests.helpers import small_config
from tests.unit.test_plot import fake_run

RUN = "gs://bucket/run"


def files(folder) -> list[str]:
  return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_config_is_saved_and_loaded_in_a_bucket(tmp_path):
  with mapped_gs(tmp_path):
    config_lib.save(small_config(), RUN)
    assert config_lib.load_saved(RUN).moe.num_experts == 4
    with pytest.raises(ConfigError, match=f"{RUN}/config.json was written for a different run"):
      config_lib.save(small_config(**{"moe.num_experts": 8}), RUN)
  assert files(tmp_path) == ["bucket/run/config.json"]


def test_tokenizer_and_token_caches_are_written_and_reused_in_a_bucket(tmp_path, monkeypatch):
  config = small_config()
  with mapped_gs(tmp_path):
    data = pipeline.load(config, RUN)
    assert str(data.tokenizer.path).startswith(f"{RUN}/tokenizer/spm-600-")
    written = files(tmp_path)
    assert len(written) == 4 and all(name.startswith("bucket/run/tokenizer/spm-600-") for name in written)
    # a second load trains nothing and tokenizes nothing: it reads the model and the three splits' arrays
    monkeypatch.setattr(pipeline, "tokenize", lambda *a: pytest.fail("tokenized again"))
    monkeypatch.setattr(pipeline.tokenizer_lib.spm.SentencePieceTrainer, "train",
                        lambda *a, **k: pytest.fail("trained again"))
    again = pipeline.load(config, RUN)
  assert files(tmp_path) == written  # and no temporary left
  assert again.tokenizer.encode(["Bonjour."], "fra") == data.tokenizer.encode(["Bonjour."], "fra")
  assert (again.tokens["train"].src_tokens == data.tokens["train"].src_tokens).all()


def test_a_token_cache_that_cannot_be_written_leaves_no_temporary(tmp_path, monkeypatch):
  split = packing.TokenizedSplit.from_lists(["fra"], [0], [[5, 1]], [[6, 1]])

  def disk_full(self, data):
    with open(self, "wb") as f:  # half of it, then the disk is full
      f.write(data[: len(data) // 2])
    raise OSError(errno.ENOSPC, "No space left on device", str(self))

  monkeypatch.setattr(type(io.path(tmp_path)), "write_bytes", disk_full)
  with pytest.raises(OSError, match="No space left"):
    split.save(tmp_path / "train.npz")
  assert files(tmp_path) == []


def test_pictures_are_written_in_a_bucket(tmp_path):
  (tmp_path / "bucket" / "run").mkdir(parents=True)
  fake_run(tmp_path / "bucket" / "run")
  with mapped_gs(tmp_path):
    written = plot.plot_run(RUN)
  assert [str(p) for p in written] == [f"{RUN}/training.png", f"{RUN}/routing.png"]
  assert files(tmp_path) == ["bucket/run/expert_load.jsonl", "bucket/run/metrics.jsonl", "bucket/run/routing.png",
                             "bucket/run/training.png"]
  assert (tmp_path / "bucket/run/training.png").read_bytes().startswith(b"\x89PNG")


def test_a_sweep_point_logs_into_a_bucket(tmp_path):
  with mapped_gs(tmp_path):
    sweep.run([sys.executable, "-c", "print('trained')"], "e4", io.path(f"{RUN}/e4/sweep.log"))
  assert (tmp_path / "bucket/run/e4/sweep.log").read_text().splitlines()[1:] == ["trained"]


def test_a_scheme_without_its_backend_is_one_line_naming_what_to_install(tmp_path, monkeypatch):
  find_spec = importlib.util.find_spec  # as on a machine without gcsfs (or TensorFlow), whatever this one has
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name in ("gcsfs", "tensorflow") else find_spec(name, *a))
  with pytest.raises(UserError) as raised:
    config_lib.save(small_config(), "gs://x/y")
  assert str(raised.value) == "gs://x/y: the gs:// backend is not installed (pip install -e '.[gcs]' (gcsfs, google-cloud-storage))"
  with pytest.raises(UserError, match=r"^ftp://x/y: unknown storage scheme 'ftp://' \(local paths, gs://"):
    io.path("ftp://x/y")

"""A work directory in object storage: what the config, data and picture code write at gs://bucket/run lands there
(tests/fake_storage.py serves the bucket from a local folder), and a scheme without its backend is one line."""

import errno
import importlib.util
import shutil
import sys
import tempfile

import numpy as np
import pytest

from gshard_mt import config_files, io
from gshard_mt.data import pipeline, shards
from gshard_mt.data import prepare as prepare_lib
from gshard_mt.errors import ConfigError, UserError
from gshard_mt.tools import plot, sweep
from gshard_mt.training import validate
from tests.fake_storage import mapped_gs
from tests.helpers import small_config
from tests.unit.test_plot import fake_run

RUN = "gs://bucket/run"


def files(folder) -> list[str]:
  return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_config_is_saved_and_loaded_in_a_bucket(tmp_path):
  with mapped_gs(tmp_path):
    config_files.save(small_config(), RUN)
    assert validate.load_saved(RUN).moe.num_experts == 4
    with pytest.raises(ConfigError, match=f"{RUN}/config.json was written for a different run"):
      config_files.save(small_config(**{"moe.num_experts": 8}), RUN)
  assert files(tmp_path) == ["bucket/run/config.json"]


def test_a_prepared_corpus_is_written_to_a_bucket_and_memory_mapped_from_local_copies(tmp_path, monkeypatch):
  config, local = small_config(), tmp_path / "local"
  local.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(local))  # where each host keeps its copy
  with mapped_gs(tmp_path / "gcs"):
    data = pipeline.load(config, RUN)
    name = data.tokenizer.path.parent.name
    assert str(data.tokenizer.path) == f"{RUN}/tokenizer/{name}/spm.model" and name.startswith("spm-600-")
    arrays = [f"{split}.{array}.bin" for split in ("train", "dev", "test") for array in shards.ARRAYS]
    written = files(tmp_path / "gcs")
    assert written == sorted(f"bucket/run/tokenizer/{name}/{f}" for f in ["manifest.json", "spm.model", *arrays])
    assert data.directory == local / "gshard_mt-prepared" / name  # the staging folder, kept as this host's copy
    batch = data.train_batches(config).batch(0)  # the sampler's index is kept in the local copy, not the bucket
    # Another host: it prepares nothing, and memory-maps a copy of the bucket's files.
    shutil.rmtree(data.directory)
    monkeypatch.setattr(prepare_lib, "build", lambda *a: pytest.fail("prepared again"))
    again = pipeline.load(config, RUN)
    assert files(tmp_path / "gcs") == written  # and no temporary left
  assert files(again.directory) == sorted(["manifest.json", "spm.model", *arrays])
  assert again.tokenizer.encode(["Bonjour."], "fra") == data.tokenizer.encode(["Bonjour."], "fra")
  for key, value in again.train_batches(config).batch(0).items():
    np.testing.assert_array_equal(value, batch[key])


def test_a_preparation_that_fails_leaves_nothing_behind(tmp_path, monkeypatch):
  add = shards.RaggedWriter.add

  def disk_full(self, values, lengths):  # the disk fills up while the tokens are written
    if values.dtype == np.uint16:
      raise OSError(errno.ENOSPC, "No space left on device", "train.src_tokens.bin")
    add(self, values, lengths)

  monkeypatch.setattr(shards.RaggedWriter, "add", disk_full)
  with pytest.raises(OSError, match="No space left"):
    pipeline.load(small_config(), tmp_path)
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
    config_files.save(small_config(), "gs://x/y")
  assert str(raised.value) == ("gs://x/y: the gs:// backend is not installed (pip install -e '.[gcs]' (gcsfs, "
                               "google-cloud-storage))")
  with pytest.raises(UserError, match=r"^ftp://x/y: unknown storage scheme 'ftp://' \(local paths, gs://"):
    io.path("ftp://x/y")

"""A failed block leaves its directory as it found it: the empty folders it made go, what it wrote stays."""

import os

import pytest

from gshard_mt import tidy


def test_a_failed_block_leaves_the_directory_as_it_found_it(tmp_path):
  with pytest.raises(KeyboardInterrupt):  # a new directory goes, with the parents made for it
    with tidy.left_as_found(tmp_path / "new" / "run"):
      (tmp_path / "new" / "run" / "tokenizer" / "spm").mkdir(parents=True)
      raise KeyboardInterrupt
  assert os.listdir(tmp_path) == []
  (tmp_path / "run" / "checkpoints").mkdir(parents=True)
  with pytest.raises(ValueError):  # in an old one what the block wrote stays, the empty folders it made go
    with tidy.left_as_found(tmp_path / "run"):
      (tmp_path / "run" / "tokenizer" / "spm" / "x").mkdir(parents=True)
      (tmp_path / "run" / "empty").mkdir()
      (tmp_path / "run" / "tokenizer" / "spm" / "manifest.json").write_text("{}")
      raise ValueError
  assert sorted(os.listdir(tmp_path / "run")) == ["checkpoints", "tokenizer"]
  assert os.listdir(tmp_path / "run" / "tokenizer" / "spm") == ["manifest.json"]
  with tidy.left_as_found(tmp_path / "ok"):  # a block that ends well keeps what it made
    (tmp_path / "ok" / "a").mkdir(parents=True)
  assert (tmp_path / "ok" / "a").is_dir()

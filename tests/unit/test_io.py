"""Atomic writes: the final name holds the old content or the whole new one, never a part, and no temporary is
left behind."""

import shutil

import pytest

from gshard_mt import io


def test_write_atomically_text_and_bytes(tmp_path):
  path = tmp_path / "scores.json"
  io.write_atomically(path, "old")
  io.write_atomically(path, "new")
  assert path.read_text() == "new"
  io.write_atomically(tmp_path / "blob", b"\x00\xff")
  assert (tmp_path / "blob").read_bytes() == b"\x00\xff"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["blob", "scores.json"]


def test_directory_atomically_replaces_the_whole_directory(tmp_path):
  path = tmp_path / "tokenizer"
  path.mkdir()
  (path / "stale").write_text("x")
  with io.directory_atomically(path) as tmp:
    (tmp / "model").write_text("m")
    assert not (path / "model").exists()  # nothing under the final name until the block ends
  assert sorted(p.name for p in path.iterdir()) == ["model"]
  assert [p.name for p in tmp_path.iterdir()] == ["tokenizer"]


def test_directory_atomically_leaves_the_old_one_on_an_error(tmp_path):
  path = tmp_path / "tokenizer"
  path.mkdir()
  (path / "model").write_text("old")
  with pytest.raises(RuntimeError, match="killed"), io.directory_atomically(path) as tmp:
    (tmp / "model").write_text("half")
    raise RuntimeError("killed")
  assert (path / "model").read_text() == "old"
  assert [p.name for p in tmp_path.iterdir()] == ["tokenizer"]


def test_remove_tree_beside_another_remover(tmp_path, monkeypatch):
  """Orbax's clean-up thread may remove the same temporary directory at the same time: the first pass meets a
  file gone from under it, and what is left goes on the next."""
  tree = tmp_path / "4.orbax-checkpoint-tmp-1"
  (tree / "state").mkdir(parents=True)
  (tree / "state" / "a").write_text("x")
  (tree / "b").write_text("y")
  real, calls = shutil.rmtree, []

  def raced(target, *args, **kwargs):
    calls.append(target)
    if len(calls) == 1:
      (tree / "b").unlink()  # the other remover got there first
      raise FileNotFoundError(2, "No such file or directory", str(tree / "b"))
    real(target, *args, **kwargs)

  monkeypatch.setattr(shutil, "rmtree", raced)
  io.remove_tree(tree)
  assert len(calls) == 2 and list(tmp_path.iterdir()) == []
  io.remove_tree(tree)  # nothing there: nothing to do
  assert len(calls) == 2
  tree.mkdir()

  def never(target, *args, **kwargs):  # a backend that fails without removing anything: no endless loop
    calls.append(target)
    raise FileNotFoundError(2, "No such file or directory", str(target))

  monkeypatch.setattr(shutil, "rmtree", never)
  with pytest.raises(FileNotFoundError):
    io.remove_tree(tree)
  assert len(calls) == 5


def test_storage_faults_behind_wrappers_and_tensorstore():
  import errno

  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device")  # no file: the one with a file is preferred
    except OSError as e:
      raise ValueError('RESOURCE_EXHAUSTED: Error writing "x/0" in OCDBT database at local file "/ck/5.tmp/": '
                       'Failed writing') from e
  except ValueError as e:
    fault = io.storage_fault(e)
  assert fault.errno == errno.ENOSPC and fault.filename == "/ck/5.tmp/"
  assert io.storage_fault(ValueError("INVALID_ARGUMENT: bad shape")) is None
  assert io.storage_fault(OSError(errno.ENOENT, "missing", "f")) is None  # not a storage fault: a bug or bad input
  assert io.describe_fault(OSError(errno.EROFS, "Read-only file system", "/no/such/dir/f")).startswith(
      "/no/such/dir/f: read-only file system (Read-only file system); ")

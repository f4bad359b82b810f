"""Atomic writes: the final name holds the old content or the whole new one, never a part, and no temporary is
left behind. A directory that cannot be created or written is a storage fault whose one line names the path and
the cause."""

import os
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
  zarr = ValueError('Opening the checkpoint: PERMISSION_DENIED: Error opening "zarr" driver: Error writing local '
                    'file "/sys/kernel/x/.zarray": [OS error 13: Permission denied]')  # a file store's, wrapped
  assert io.storage_fault(zarr).errno == errno.EACCES and io.storage_fault(zarr).filename == "/sys/kernel/x/.zarray"
  assert io.storage_fault(OSError(errno.ENOENT, "missing", "f")) is None  # not a storage fault: a bug or bad input
  assert io.describe_fault(OSError(errno.EROFS, "Read-only file system", "/no/such/dir/f")).startswith(
      "/no/such/dir/f: read-only file system; ")  # the system's words only where they say more
  assert io.describe_fault(OSError(errno.ENOSPC, "No space left on device", "/no/f")).startswith(
      "/no/f: disk full (No space left on device); ")


# A directory that cannot be created or written is a storage fault: one line naming the path and the cause.
def fault_line(error: BaseException) -> str:
  fault = io.storage_fault(error)
  assert fault is not None, error
  line = io.describe_fault(fault)
  assert "\n" not in line
  return line


@pytest.mark.parametrize("below", ["", "x", "x/y"])
def test_a_file_on_the_way_of_a_directory(tmp_path, below):
  (tmp_path / "notes").write_text("a file")
  target = tmp_path / "notes" / below if below else tmp_path / "notes"
  with pytest.raises(io.PathFault) as caught:
    io.check_writable(target, "work directory")
  assert fault_line(caught.value) == (f"{os.path.normpath(target)}: cannot create the work directory: "
                                      f"{tmp_path / 'notes'} is a file, not a directory")


def test_a_relative_path_is_named_as_given(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "README.md").write_text("a file")
  with pytest.raises(io.PathFault) as caught:
    io.make_directory("README.md/x", "work directory")
  assert fault_line(caught.value) == ("README.md/x: cannot create the work directory: README.md is a file, not a "
                                      "directory")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where nothing can be created")
def test_a_directory_that_cannot_be_created(tmp_path):
  with pytest.raises(io.PathFault) as caught:  # ENOENT, as root too: procfs creates nothing
    io.check_writable("/proc/x/run", "work directory")
  assert fault_line(caught.value) == ("/proc/x/run: cannot create the work directory in /proc (No such file or "
                                      "directory)")


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs Linux's /sys, which refuses new directories")
@pytest.mark.parametrize("target, named", [("/sys/x/run", "/sys/x"), ("/sys/kernel", "/sys/kernel")])
def test_a_directory_without_permission_as_any_user(target, named):
  with pytest.raises(OSError) as caught:  # EPERM or EACCES, as root too: sysfs creates nothing
    io.check_writable(target, "work directory")
  line = fault_line(caught.value)
  assert line.startswith(f"{named}: ") and ("permission denied" in line or "operation not permitted" in line), line


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write in any directory whatever its permissions; "
                    "test_a_directory_without_permission_as_any_user covers root")
@pytest.mark.parametrize("where", ["in", "below"])
def test_a_directory_without_permission(tmp_path, where):
  locked = tmp_path / "locked"
  locked.mkdir(mode=0o500)
  try:
    with pytest.raises(PermissionError) as caught:
      io.check_writable(locked if where == "in" else locked / "run", "work directory")
    assert fault_line(caught.value).startswith(f"{locked}") and "permission denied" in fault_line(caught.value)
  finally:
    locked.chmod(0o700)


def test_a_writable_directory_is_created_and_left_empty(tmp_path):
  assert io.check_writable(tmp_path / "a" / "b") == tmp_path / "a" / "b"
  assert list((tmp_path / "a" / "b").iterdir()) == []


def test_a_directory_checked_without_creating_it(tmp_path):
  assert io.check_writable(tmp_path / "run" / "eval", create=False) == tmp_path / "run" / "eval"
  assert list(tmp_path.iterdir()) == []  # nothing created, no probe left
  (tmp_path / "run").write_text("a file")
  with pytest.raises(io.PathFault) as caught:
    io.check_writable(tmp_path / "run" / "eval", "eval output directory", create=False)
  assert fault_line(caught.value) == (f"{tmp_path}/run/eval: cannot create the eval output directory: "
                                      f"{tmp_path}/run is a file, not a directory")


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs Linux's /sys, which refuses new files")
def test_a_directory_checked_without_creating_it_where_nothing_can_be_written():
  with pytest.raises(PermissionError) as caught:  # as root too
    io.check_writable("/sys/kernel/x/eval", create=False)
  assert fault_line(caught.value).startswith("/sys/kernel: permission denied")

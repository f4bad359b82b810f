"""One writer per directory: a second is refused in one line naming the holder; a dead holder's lock is taken
over, on a local disk (flock) and on object storage (a heartbeat object)."""

import fcntl
import json
import os
import subprocess
import sys
import time

import pytest

from gshard_mt import lock
from gshard_mt.errors import WorkdirError
from tests.fake_storage import mapped_gs


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
  with lock.hold(tmp_path / "run"):
    with pytest.raises(WorkdirError, match=r"run is in use by another writer: host \S+, pid \d+, started 20"):
      with lock.hold(tmp_path / "run"):
        pass
    with lock.hold(tmp_path / "other"):  # another directory is free
      pass
  with lock.hold(tmp_path / "run"):  # released at the end of the block
    pass


def test_a_killed_holder_leaves_a_lock_that_is_taken_over(tmp_path):
  holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from gshard_mt import lock\n"
                             f"with lock.hold({str(tmp_path)!r}):\n  print('held', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
  assert holder.stdout.readline() == "held\n"
  with pytest.raises(WorkdirError, match=f"pid {holder.pid},"):
    with lock.hold(tmp_path):
      pass
  holder.kill()
  holder.wait()
  with lock.hold(tmp_path):
    assert json.loads((tmp_path / lock.LOCK_NAME).read_text())["pid"] != holder.pid


def test_the_lock_file_exists_while_held_and_a_refused_writer_leaves_it(tmp_path):
  with lock.hold(tmp_path / "run"):
    with pytest.raises(WorkdirError):
      with lock.hold(tmp_path / "run"):
        pass
    assert json.loads((tmp_path / "run" / lock.LOCK_NAME).read_text())["pid"] == os.getpid()
  assert os.listdir(tmp_path / "run") == []  # the directory made stays: its block ended well


def test_a_lock_file_removed_between_the_open_and_the_flock_is_opened_again(tmp_path, monkeypatch):
  """Its holder ended in between: this process would hold a file no longer at the path, which another writer
  could then make and lock as well."""
  path, flock, calls = tmp_path / lock.LOCK_NAME, fcntl.flock, []

  def holder_ends_first(fd, operation):
    if not calls:
      path.unlink()
      path.write_text("")  # the next writer's file
    calls.append(fd)
    flock(fd, operation)

  monkeypatch.setattr(fcntl, "flock", holder_ends_first)
  fd = lock._locked(path, tmp_path)
  assert len(calls) == 2 and os.fstat(fd).st_ino == os.stat(path).st_ino
  os.close(fd)


def test_disabled_holds_nothing(tmp_path):
  with lock.hold(tmp_path, enabled=False), lock.hold(tmp_path):
    pass


def test_object_storage_lock_heartbeat_and_stale_takeover(tmp_path):
  with mapped_gs(tmp_path):
    path = tmp_path / "bucket" / "run" / lock.LOCK_NAME
    with lock.hold("gs://bucket/run", heartbeat_s=0.05, settle_s=0):
      first = json.loads(path.read_text())
      time.sleep(0.3)
      assert json.loads(path.read_text())["heartbeat"] > first["heartbeat"]  # the holder is alive
      with pytest.raises(WorkdirError, match="gs://bucket/run is in use by another writer"):
        with lock.hold("gs://bucket/run", settle_s=0):
          pass
    assert not path.exists()  # released
    path.write_text(json.dumps(first | {"heartbeat": time.time() - 600}))  # a holder that died 10 minutes ago
    with lock.hold("gs://bucket/run", settle_s=0):
      assert json.loads(path.read_text())["token"] != first["token"]


def test_object_storage_race_is_settled_by_the_last_writer(tmp_path, monkeypatch):
  with mapped_gs(tmp_path):
    path = tmp_path / "bucket" / "run" / lock.LOCK_NAME
    # another writer's object lands while this one waits to read its own back
    monkeypatch.setattr(lock.time, "sleep", lambda s: path.write_text(json.dumps(
        {"host": "other", "pid": 7, "started": "then", "token": "theirs", "heartbeat": time.time()})))
    with pytest.raises(WorkdirError, match="host other, pid 7"):
      with lock.hold("gs://bucket/run"):
        pass


def test_a_holder_whose_lock_was_taken_over_stops_beating_and_leaves_the_new_lock(tmp_path, caplog):
  """A heartbeat that stalled past STALE_S let another writer take over: the first neither overwrites nor deletes
  the new holder's lock, and says so."""
  with mapped_gs(tmp_path):
    path = tmp_path / "bucket" / "run" / lock.LOCK_NAME
    theirs = {"host": "other", "pid": 7, "started": "then", "token": "theirs", "heartbeat": time.time()}
    with lock.hold("gs://bucket/run", heartbeat_s=0.05, settle_s=0):
      path.write_text(json.dumps(theirs))  # the takeover
      time.sleep(0.3)
      assert json.loads(path.read_text()) == theirs  # not beaten over
    assert json.loads(path.read_text()) == theirs  # nor removed at the end
  assert "lost the lock of gs://bucket/run to host other, pid 7" in caplog.text

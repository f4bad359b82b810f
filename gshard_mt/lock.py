"""One writer per directory: train.py holds its work directory, eval.py the output it writes, for their whole life.

A second writer is refused at once, in one line naming the holder (host, pid, start time). On a local disk the lock
is `fcntl.flock` on `<directory>/.lock`, which the kernel releases when the holder dies, so a lock left by a killed
process is simply taken over. Object storage has no file lock: the lock is an object that a holder rewrites every
`heartbeat_s` seconds; one whose heartbeat is older than `stale_s` belongs to a dead process and is taken over. Two
starts within the same moment are settled by reading the object back after a pause: the last writer keeps it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid

from gshard_mt import io
from gshard_mt.errors import WorkdirError

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"


def _holder() -> dict:
  return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
          "token": uuid.uuid4().hex, "heartbeat": time.time()}


def _refusal(directory, holder: dict) -> WorkdirError:
  return WorkdirError(f"{directory} is in use by another writer: host {holder.get('host', '?')}, pid "
                      f"{holder.get('pid', '?')}, started {holder.get('started', '?')} (wait for it to end, or use "
                      f"another directory)")


@contextlib.contextmanager
def hold(directory: io.PathLike, *, name: str = LOCK_NAME, enabled: bool = True, heartbeat_s: float = 30.0,
         stale_s: float = 120.0, settle_s: float = 2.0):
  """Holds the lock `<directory>/<name>` (the directory created if missing) for the block; `enabled=False` (a
  process other than 0 of a multi-host run) holds nothing."""
  if not enabled:
    yield
    return
  directory = io.make_directory(directory)
  if io.is_local(directory):
    with _file_lock(directory, name):
      yield
  else:
    with _object_lock(directory, name, heartbeat_s, stale_s, settle_s):
      yield


@contextlib.contextmanager
def _file_lock(directory, name: str):
  fd = os.open(directory / name, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise _refusal(directory, _read_json(os.pread(fd, 4096, 0))) from None
    data = json.dumps(_holder()).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    yield
  finally:
    os.close(fd)  # releases the flock


def _read_json(data: bytes | str) -> dict:
  try:
    return json.loads(data)
  except ValueError:
    return {}


@contextlib.contextmanager
def _object_lock(directory, name: str, heartbeat_s: float, stale_s: float, settle_s: float):
  path = directory / name
  if path.exists():
    holder = _read_json(path.read_text())
    age = time.time() - holder.get("heartbeat", 0)
    if age < stale_s:
      raise _refusal(directory, holder)
    log.warning("taking over the lock of %s: its holder's last heartbeat was %.0f s ago", directory, age)
  me = _holder()
  io.write_atomically(path, json.dumps(me))
  time.sleep(settle_s)  # a writer that started at the same moment has overwritten the object by now
  holder = _read_json(path.read_text())
  if holder.get("token") != me["token"]:
    raise _refusal(directory, holder)
  stop = threading.Event()

  def beat():
    while not stop.wait(heartbeat_s):
      io.write_atomically(path, json.dumps(me | {"heartbeat": time.time()}))

  thread = threading.Thread(target=beat, name="lock-heartbeat", daemon=True)
  thread.start()
  try:
    yield
  finally:
    stop.set()
    thread.join()
    with contextlib.suppress(OSError):
      path.unlink()

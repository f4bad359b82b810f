"""One writer per directory (train.py's work directory, eval.py's output); a second is refused at once, in one line
naming the holder. Locally: `fcntl.flock` on a file that exists while it is held, which the kernel releases when
the holder dies. Object storage has no file lock: the lock is an object its holder rewrites every `heartbeat_s`,
taken over once its heartbeat is STALE_S old; two starts at the same moment are settled by reading it back after a
pause (the last writer keeps it). Neither lock outlives its holder's block.
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
STALE_S = 120.0  # an object lock's heartbeat older than this: its holder is dead


def _holder() -> dict:
  return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
          "token": uuid.uuid4().hex, "heartbeat": time.time()}


def _refusal(directory, holder: dict) -> WorkdirError:
  return WorkdirError(f"{directory} is in use by another writer: host {holder.get('host', '?')}, pid "
                      f"{holder.get('pid', '?')}, started {holder.get('started', '?')} (wait for it to end, or use "
                      f"another directory)")


def hold(directory: io.PathLike, *, name: str = LOCK_NAME, enabled: bool = True, heartbeat_s: float = 30.0,
         settle_s: float = 2.0) -> contextlib.AbstractContextManager:
  """The lock `<directory>/<name>` (the directory created if missing), held for a `with` block; `enabled=False` (a
  process other than 0 of a multi-host run) holds nothing."""
  if not enabled:
    return contextlib.nullcontext()
  directory = io.make_directory(directory)
  if io.is_local(directory):
    return _file_lock(directory, name)
  return _object_lock(directory, name, heartbeat_s, settle_s)


@contextlib.contextmanager
def _file_lock(directory, name: str):
  fd = _locked(directory / name, directory)
  try:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(_holder()).encode(), 0)
    yield
  finally:
    with contextlib.suppress(FileNotFoundError):  # removed by hand
      os.unlink(directory / name)  # while held: a writer waiting on this file finds it gone and makes its own
    os.close(fd)  # releases the flock


def _locked(path, directory) -> int:
  """A descriptor of `path`, flocked, whose file is still the one at `path`: a holder that ended between this
  process's open and its flock has removed the file it held (then the open is tried again)."""
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _read_json(os.pread(fd, 4096, 0))
      os.close(fd)
      raise _refusal(directory, holder) from None
    with contextlib.suppress(FileNotFoundError):
      if os.stat(path).st_ino == os.fstat(fd).st_ino:
        return fd
    os.close(fd)


def _read_json(data: bytes | str) -> dict:
  try:
    return json.loads(data)
  except ValueError:
    return {}


@contextlib.contextmanager
def _object_lock(directory, name: str, heartbeat_s: float, settle_s: float):
  path = directory / name
  if path.exists():
    holder = _read_json(path.read_text())
    age = time.time() - holder.get("heartbeat", 0)
    if age < STALE_S:
      raise _refusal(directory, holder)
    log.warning("taking over the lock of %s: its holder's last heartbeat was %.0f s ago", directory, age)
  me = _holder()
  io.write_atomically(path, json.dumps(me))
  time.sleep(settle_s)  # a writer that started at the same moment has overwritten the object by now
  holder = _read_json(path.read_text())
  if holder.get("token") != me["token"]:
    raise _refusal(directory, holder)
  stop = threading.Event()

  def ours() -> bool:  # a heartbeat that stalled past STALE_S may have let another writer take the lock over
    try:
      holder = _read_json(path.read_text()) if path.exists() else {}
    except OSError:  # a failed read of object storage: beat on, look again at the next beat
      return True
    if holder.get("token") == me["token"]:
      return True
    log.error("lost the lock of %s to host %s, pid %s (this process's heartbeat stalled for over %.0f s): two "
              "writers now share the directory", directory, holder.get("host", "?"), holder.get("pid", "?"), STALE_S)
    return False

  def beat():
    while not stop.wait(heartbeat_s) and ours():
      io.write_atomically(path, json.dumps(me | {"heartbeat": time.time()}))

  thread = threading.Thread(target=beat, name="lock-heartbeat", daemon=True)
  thread.start()
  try:
    yield
  finally:
    stop.set()
    thread.join()
    with contextlib.suppress(OSError):
      if ours():  # never the lock of a writer that took it over
        path.unlink()

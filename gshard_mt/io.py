"""The one path layer: every file goes through `etils.epath`, so a work directory may be a local folder or object
storage (`gs://bucket/run` on a TPU pod, whose hosts share no disk). Writes go to a temporary name, then a rename,
so no half-written file has the final name. Storage faults (a full disk, a read-only or forbidden path) are
recognised by `storage_fault`, which the entry points turn into one line (`cli.run`).
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import re
import shutil

from etils import epath

from gshard_mt.errors import UserError, WorkdirError

# What each scheme needs installed: epath's fsspec backend, and for gs:// the client Orbax asks about the bucket.
BACKENDS = {"gs": (("gcsfs", "google.cloud.storage"), "pip install -e '.[gcs]' (gcsfs, google-cloud-storage)"),
            "s3": (("s3fs",), "pip install s3fs"), "az": (("adlfs",), "pip install adlfs"),
            "hf": (("huggingface_hub",), "pip install huggingface_hub")}
# The errors of storage rather than of the program: one line and STORAGE_EXIT_CODE.
STORAGE_ERRNOS = {errno.ENOSPC: "disk full", errno.EDQUOT: "quota exceeded", errno.EROFS: "read-only file system",
                  errno.EACCES: "permission denied", errno.EPERM: "operation not permitted"}
TENSORSTORE_ERRNOS = {"RESOURCE_EXHAUSTED": errno.ENOSPC, "PERMISSION_DENIED": errno.EACCES}
# its messages, wrapped or not: '... at local file "/ck/5.tmp/"' (OCDBT), 'Error writing local file "/x/.zarray"'
TENSORSTORE_FAULT = re.compile(r'(?P<status>RESOURCE_EXHAUSTED|PERMISSION_DENIED): .*?local file "(?P<file>[^"]+)"')
STORAGE_EXIT_CODE = 74  # sysexits.h EX_IOERR: a fault of the storage, not of the input (which exits 2)

PathLike = str | os.PathLike


def scheme(path: PathLike) -> str | None:
  """'gs' for gs://bucket/x, None for a local path."""
  text = os.fspath(path)
  return text.split("://", 1)[0] if "://" in text else None


def path(p: PathLike) -> epath.Path:
  """The epath of `p`; an unknown scheme, or one whose backend is not installed, is a UserError naming what to
  install."""
  name = scheme(p)
  if name is not None:
    if name not in BACKENDS:
      raise UserError(f"{os.fspath(p)}: unknown storage scheme '{name}://' (local paths, "
                      + ", ".join(f"{s}://" for s in BACKENDS) + ")")
    modules, install = BACKENDS[name]
    if not all(_installed(m) for m in modules):
      raise UserError(f"{os.fspath(p)}: the {name}:// backend is not installed ({install})")
  return epath.Path(p)


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # a missing parent package (google.cloud)
    return False


def is_local(p: PathLike) -> bool:
  return scheme(p) is None


def absolute(p: PathLike) -> epath.Path:
  """A local path made absolute (epath's resolve() would turn gs://b/x into <cwd>/gs:/b/x)."""
  p = path(p)
  return p.resolve() if is_local(p) else p


def stamp(file: PathLike) -> tuple[int, list[int]]:
  """(size, times) of a file, which change when its content may have: a local file's modification and change times
  in ns (an edit within a second, or a copy keeping the modification time, changes them); an object's time (object
  storage rewrites an object whole)."""
  if is_local(file):
    stat = os.stat(file)
    return stat.st_size, [stat.st_mtime_ns, stat.st_ctime_ns]
  stat = path(file).stat()
  return stat.length, [stat.mtime]


def _temporary(target: epath.Path, kind: str) -> epath.Path:
  return target.with_name(f".{target.name}.{kind}{os.getpid()}")


@contextlib.contextmanager
def _naming(target: epath.Path):
  """A write's OSError names the file it was writing (a full disk fails `write`, which names none)."""
  try:
    yield
  except OSError as e:
    if e.filename is None and e.errno is not None:
      raise OSError(e.errno, e.strerror, os.fspath(target)) from e
    raise


def write_atomically(target: PathLike, data: str | bytes) -> None:
  """Writes `data` beside `target`, then renames it over `target` (atomic on one local filesystem; one object
  write on object storage); on any error the temporary is removed."""
  target = path(target)
  tmp = _temporary(target, "tmp")
  try:
    with _naming(target):
      tmp.write_bytes(data.encode() if isinstance(data, str) else data)
      tmp.replace(target)
  except BaseException:
    with contextlib.suppress(OSError):
      tmp.unlink(missing_ok=True)
    raise


def append(target: PathLike, data: str | bytes) -> None:
  """Appends `data` (text as UTF-8) to a file and syncs it. Object storage has no append: the object is written
  again whole (the files appended to, metrics, event and sweep logs, stay small)."""
  data, target = data.encode() if isinstance(data, str) else data, path(target)
  if is_local(target):
    with _naming(target), open(target, "ab") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
  else:
    write_atomically(target, (target.read_bytes() if target.exists() else b"") + data)


def read_jsonl(target: PathLike) -> list[dict]:
  """The rows of a JSON-lines file ([] when it does not exist). A last line that does not parse and lacks its
  newline is an append cut short (a kill, a full disk): left out, and `ends_cut_short` says so. Any other line that
  does not parse is a WorkdirError naming the file and line."""
  target = path(target)
  lines = target.read_text().splitlines() if target.exists() else []
  rows = []
  for number, line in enumerate(lines, 1):
    try:
      rows += [json.loads(line)] if line.strip() else []
    except json.JSONDecodeError as e:
      if number < len(lines) or not ends_cut_short(target):
        raise WorkdirError(f"{target}:{number}: not a JSON line ({e.msg}, column {e.colno})") from None
  return rows


def ends_cut_short(target: PathLike) -> bool:
  """Whether a non-empty file lacks the newline that ends every line an append writes."""
  target = path(target)
  data = target.read_bytes() if target.exists() else b""
  return bool(data) and not data.endswith(b"\n")


def remove_tree(target: PathLike) -> None:
  """Removes a file or a directory tree if there is one. Another remover at the same time (Orbax's clean-up
  thread) is no error: what it leaves goes on the next pass; a tree still there after three passes raises."""
  target = path(target)
  passes = 3
  for attempt in range(passes):
    if not target.exists():
      return
    try:
      if target.is_dir():
        target.rmtree()
      else:
        target.unlink()
    except FileNotFoundError:
      if attempt == passes - 1:
        raise


@contextlib.contextmanager
def directory_atomically(target: PathLike):
  """Yields a temporary directory beside `target` to fill; on success it replaces `target` whole, on an error
  `target` is left as it was."""
  target = path(target)
  tmp, old = _temporary(target, "tmp"), _temporary(target, "old")
  remove_tree(tmp)
  tmp.mkdir(parents=True)
  try:
    yield tmp
  except BaseException:
    with contextlib.suppress(OSError):
      remove_tree(tmp)
    raise
  if target.exists():
    target.rename(old)
  tmp.rename(target)
  remove_tree(old)


class PathFault(OSError):
  """A path that cannot be a directory for a reason other than STORAGE_ERRNOS (a file in its way; /proc): a
  storage fault all the same. Its filename is the path, its strerror says why."""


def make_directory(directory: PathLike, what: str = "directory") -> epath.Path:
  """Creates `directory` and its parents; a path that cannot be created is a storage fault naming it and why
  ('runs/x/y: cannot create the work directory: runs/x is a file, not a directory')."""
  directory = path(directory)
  try:
    directory.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise _unusable(directory, what, e) from None
  return directory


def check_writable(directory: PathLike, what: str = "output directory", *, create: bool = True) -> epath.Path:
  """Creates `directory` and writes and removes a probe file in it: a directory that cannot be written is refused
  in one line, as a storage fault, before any expensive work. With create=False a missing local directory is not
  created: the probe goes to the nearest part of its path that exists."""
  directory = path(directory)
  if create or not is_local(directory):
    where = make_directory(directory, what)
  else:
    where = path(_existing_part(os.fspath(directory)))
    if not where.is_dir():
      raise _unusable(directory, what, OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), os.fspath(where)))
  probe = _temporary(where / "probe", "write")
  try:
    probe.write_text("")
    probe.unlink()
  except OSError as e:  # named by the directory, not by the probe's temporary name
    raise _unusable(directory, what, OSError(e.errno, e.strerror, os.fspath(where))) from None
  return directory


def _unusable(directory: epath.Path, what: str, error: OSError) -> OSError:
  """The storage fault of a directory that could not be created or written: `error`, named, where its errno is
  one of STORAGE_ERRNOS; else a PathFault saying why."""
  if error.errno in STORAGE_ERRNOS:
    return OSError(error.errno, error.strerror, error.filename or os.fspath(directory))
  if not is_local(directory):
    return PathFault(error.errno, f"cannot create the {what} ({error.strerror or error})", os.fspath(directory))
  # a file at the nearest existing part is the cause (README.md/x); a directory there refuses new entries (/proc)
  part = _existing_part(os.fspath(directory))
  if not os.path.isdir(part):
    line = f"cannot create the {what}: {part} is a file, not a directory"
  elif part == os.path.normpath(os.fspath(directory)):
    line = f"cannot write in the {what} ({error.strerror or error})"
  else:
    line = f"cannot create the {what} in {part} ({error.strerror or error})"
  return PathFault(error.errno, line, os.fspath(directory))


def _existing_part(local: str) -> str:
  """The nearest part of the local path that exists ('.' for a relative path of which none does)."""
  part = os.path.normpath(local)
  while not os.path.lexists(part) and os.path.dirname(part) not in ("", part):
    part = os.path.dirname(part)
  return part if os.path.lexists(part) else "."


def storage_fault(error: BaseException) -> OSError | None:
  """The storage fault (STORAGE_ERRNOS, a PathFault) behind `error`, following causes, contexts and exception
  groups (Orbax and thread pools wrap the OSError of a failed write), preferring one that names its file; or None."""
  seen, todo, found = set(), [error], []
  while todo:
    e = todo.pop()
    if e is None or id(e) in seen:
      continue
    seen.add(id(e))
    if isinstance(e, PathFault) or isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
      found.append(e)
    elif isinstance(e, ValueError) and (match := TENSORSTORE_FAULT.search(str(e))):
      code = TENSORSTORE_ERRNOS[match["status"]]  # TensorStore, which writes Orbax's arrays, fails with a ValueError
      found.append(OSError(code, os.strerror(code), match["file"]))
    todo += [e.__cause__, e.__context__] + list(getattr(e, "exceptions", ()))
  return max(found, key=lambda e: e.filename is not None, default=None)


def describe_fault(fault: OSError) -> str:
  """One line: the path, what failed, and the free space of its filesystem where it can be read."""
  where = fault.filename or "(a file)"
  if isinstance(fault, PathFault):
    return f"{where}: {fault.strerror}"
  what, cause = STORAGE_ERRNOS[fault.errno], fault.strerror or os.strerror(fault.errno)
  line = f"{where}: {what}" + ("" if cause.lower() == what else f" ({cause})")  # the system's words if they add
  if where != "(a file)" and is_local(where):
    with contextlib.suppress(OSError):
      line += f"; {_size(shutil.disk_usage(_existing_part(os.path.abspath(where))).free)} free on its filesystem"
  return line


def _size(n: float) -> str:
  for unit in ("B", "KiB", "MiB"):
    if n < 1024:
      return f"{n:.1f} {unit}"
    n /= 1024
  return f"{n:.1f} GiB"

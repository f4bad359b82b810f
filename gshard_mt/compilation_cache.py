"""JAX's persistent compilation cache, on for every command (`cli.run`): compiled programs are kept on disk, so a
restarted run, a second eval.py or translate.py of a work directory and a tool run again load them instead of
compiling them again (bench/cache_start.py measures train.py's start to its first step, cold and warm).

Where, the first that is set: `--compilation_cache DIR` on any command, $GSHARD_MT_COMPILATION_CACHE, JAX's own
$JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/gshard_mt/jax (~/.cache/gshard_mt/jax), one folder per user made
readable by the user alone. `off` (or `0`, `none`) turns it off. The choice is exported in
$GSHARD_MT_COMPILATION_CACHE, so the processes a command starts (sweep, study) use the same. The first compile logs
the folder; the first step's line says how many programs came from it.

JAX's settings (jax/_src/config.py, jaxlib 0.12): `jax_compilation_cache_dir` (the folder; local or gs://...),
`jax_enable_compilation_cache`, `jax_persistent_cache_min_compile_time_secs` (default 1: programs that compile
faster are not written) and `jax_persistent_cache_min_entry_size_bytes` (default 0); their JAX_* environment variables
are left to JAX. The CPU needs nothing more: "cpu" is among the platforms JAX caches for.

Caveats, from JAX's guide (docs/persistent_compilation_cache.md) and source:
- The cache is trusted: whoever can write to the folder can run code in your processes. Never point it at a folder
  that others can write to.
- Several processes (multi-host): every process compiles a cold program, and only process 0 writes it; all of them
  read. On a disk of one host the other hosts find nothing and compile again each time: to share the programs, give
  every host the same folder on shared storage (NFS, or gs://bucket/path with the `gcs` extra). The log says so when
  a run of several processes uses a local folder.
- Object storage (gs://): create the bucket in the workload's region and project, and set an object lifecycle (age,
  Delete) of the run's length: nothing is ever evicted. Locally nothing is evicted either: the folder grows with each
  new program, and may be deleted at any time.
- A CPU program is compiled for the host's CPU, which the key does not name: with a home folder shared by machines of
  different CPUs, a program from another machine may be refused (a warning) and compiled again.
"""

from __future__ import annotations

import logging
import os

import jax

from gshard_mt import io

log = logging.getLogger(__name__)

FLAG = "--compilation_cache"
SWITCH = "GSHARD_MT_COMPILATION_CACHE"
JAX_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
OFF = ("off", "0", "none", "false", "no")
# JAX's monitoring events: once per process when the cache is used, a program loaded, a program written.
USED, HIT, WRITTEN = ("/jax/compilation_cache/tasks_using_cache", "/jax/compilation_cache/cache_hits",
                      "/jax/compilation_cache/cache_misses")

_counts = {"loaded": 0, "written": 0}
_state: dict = {"folder": None, "source": None, "listening": False}


def default_folder(environ=os.environ) -> str:
  """$XDG_CACHE_HOME/gshard_mt/jax, or ~/.cache/gshard_mt/jax."""
  base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "gshard_mt", "jax")


def choose(flag: str | None = None, environ=os.environ) -> tuple[str | None, str]:
  """(the cache folder, or None for off; what chose it): the flag, $GSHARD_MT_COMPILATION_CACHE,
  $JAX_COMPILATION_CACHE_DIR or the default, the first set (an empty value counts as unset)."""
  for value, source in ((flag, FLAG), (environ.get(SWITCH), SWITCH), (environ.get(JAX_VARIABLE), JAX_VARIABLE)):
    if value is not None and value.strip():
      value = value.strip()
      if value.lower() in OFF:
        return None, source
      return (os.path.abspath(os.path.expanduser(value)) if io.is_local(value) else value), source
  return default_folder(environ), "default"


def take_flag(argv: list[str]) -> tuple[list[str], str | None]:
  """(argv without `--compilation_cache VALUE` or `--compilation_cache=VALUE`, its last VALUE or None). A flag
  without a value is left in argv for the command's parser to refuse."""
  rest, value, i = [], None, 0
  while i < len(argv):
    word = argv[i]
    if word.startswith(FLAG + "="):
      value = word.split("=", 1)[1]
    elif word == FLAG and i + 1 < len(argv):
      value, i = argv[i + 1], i + 1
    else:
      rest.append(word)
    i += 1
  return rest, value


def setup(flag: str | None = None, environ=os.environ) -> str | None:
  """Turns the cache on in the chosen folder (made when missing, private to the user) or off; returns the folder
  (None: off). Call before anything compiles: JAX opens the cache at the first compile."""
  folder, source = choose(flag, environ)
  environ[SWITCH] = folder or "off"
  if folder is not None and io.is_local(folder):
    try:
      os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as e:
      log.warning("compilation cache off: cannot make %s (%s)", folder, e.strerror or e)
      folder, environ[SWITCH] = None, "off"
  _state.update(folder=folder, source=source)
  if folder is None:
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", folder)
  if not _state["listening"]:
    jax.monitoring.register_event_listener(_on_event)
    _state["listening"] = True
  return folder


def counts() -> dict:
  """{'loaded': programs loaded from the cache, 'written': programs written to it} in this process so far."""
  return dict(_counts)


def summary() -> str:
  """What the cache did so far, for a log line ('compilation cache: 3 programs loaded, 1 written'); '' where
  `setup` has not run (a library call, not a command)."""
  if _state["source"] is None:
    return ""
  if _state["folder"] is None:
    return "compilation cache off"
  return f"compilation cache: {_counts['loaded']} programs loaded, {_counts['written']} written"


def _on_event(event: str, **_):
  if event == HIT:
    _counts["loaded"] += 1
  elif event == WRITTEN:
    _counts["written"] += 1
  elif event == USED:
    _log_folder()


def _log_folder():
  folder, source = _state["folder"], _state["source"]
  where = "the default" if source == "default" else f"from {source}"
  log.info("compilation cache: %s (%s; %s DIR moves it, %s off turns it off)", folder, where, FLAG, FLAG)
  if jax.process_count() > 1 and io.is_local(folder):
    log.info("compilation cache: only process 0 writes it, so the other hosts share its programs only when %s is "
             "on storage every host sees (NFS, gs://...)", folder)

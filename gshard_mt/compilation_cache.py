"""JAX's persistent compilation cache, on for every command (`cli.run`): a restarted run, a second eval.py of a
work directory or a tool run again loads its compiled programs instead of compiling them (README, bench/cache_start.py).
The folder (`choose`) is exported in $GSHARD_MT_COMPILATION_CACHE, so the processes a command starts (sweep, study)
share it; JAX's other settings (minimum compile time and entry size) are left to JAX.

Caveats (JAX's docs/persistent_compilation_cache.md): the cache is trusted (whoever can write to the folder can run
code in your processes); only process 0 writes it; nothing is evicted (give a bucket an object lifecycle; a local
folder may be deleted at any time); a CPU program's key does not name the host's CPU, so a home folder shared by
different CPUs may refuse another machine's program (a warning) and compile it again.
"""

from __future__ import annotations

import logging
import os

import jax

from gshard_mt import hints, io

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
  """(the cache folder, or None for off; what chose it): the first set (not empty) of the flag,
  $GSHARD_MT_COMPILATION_CACHE and $JAX_COMPILATION_CACHE_DIR, else the default."""
  for value, source in ((flag, FLAG), (environ.get(SWITCH), SWITCH), (environ.get(JAX_VARIABLE), JAX_VARIABLE)):
    if value := (value or "").strip():
      if value.lower() in OFF:
        return None, source
      return (os.path.abspath(os.path.expanduser(value)) if io.is_local(value) else value), source
  return default_folder(environ), "default"


def take_flag(argv: list[str]) -> tuple[list[str], str | None]:
  """(argv without `--compilation_cache [=]VALUE`, its last VALUE or None); a flag without a value is left for
  the command's parser to refuse."""
  rest, value, words = [], None, iter(argv)
  for word in words:
    if word.startswith(FLAG + "="):
      value = word.split("=", 1)[1]
    elif word == FLAG and (following := next(words, None)) is not None:
      value = following
    else:
      rest.append(word)
  return rest, value


def setup(flag: str | None = None, environ=os.environ) -> str | None:
  """Turns the cache on in the chosen folder (made private to the user) or off; returns the folder or None. Call
  before anything compiles: JAX opens the cache at the first compile."""
  folder, source = choose(flag, environ)
  if folder is not None and io.is_local(folder):
    try:
      os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as e:
      log.warning("compilation cache off: cannot make %s (%s)", folder, e.strerror or e)
      folder = None
  environ[SWITCH] = folder or "off"
  _state.update(folder=folder, source=source)
  jax.config.update("jax_enable_compilation_cache", folder is not None)
  if folder is None:
    return None
  jax.config.update("jax_compilation_cache_dir", folder)
  if not _state["listening"]:
    jax.monitoring.register_event_listener(_on_event)
    _state["listening"] = True
  return folder


def counts() -> dict:
  """{'loaded': programs loaded from the cache, 'written': programs written to it} in this process so far."""
  return dict(_counts)


def summary() -> str:
  """'compilation cache: 3 programs loaded, 1 written' so far; '' where `setup` has not run (no command)."""
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
    folder, source = _state["folder"], _state["source"]
    where = "the default" if source == "default" else f"from {source}"
    log.info("compilation cache: %s (%s; %s moves it to DIR, off turns it off)", folder, where,
             hints.command({FLAG: "DIR"}))
    if jax.process_count() > 1 and io.is_local(folder):
      log.info("compilation cache: only process 0 writes it, so the other hosts share its programs only when %s "
               "is on storage every host sees (NFS, gs://...)", folder)

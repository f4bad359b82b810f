"""Object storage on a local folder, for tests: `gs://bucket/run` is served from `<root>/bucket/run`.

epath's own test helper (`etils.epath.testing.mock_epath`) swaps the backends of every scheme for one whose
functions we wrap to map the paths; TensorStore, which writes Orbax's arrays through its own GCS driver, is
given its file driver on the mapped folder instead, and the bucket is a flat one (Orbax asks GCS for its layout).
`etils` stands in for the packages that `gshard_mt.io` asks for. Nothing else changes: the code under test sees
and writes `gs://` paths.

  python -m tests.fake_storage ROOT script.py [args...]   runs a script with the mapping in place
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
from unittest import mock

PREFIX = "gs://"


@contextlib.contextmanager
def mapped_gs(root: str | os.PathLike):
  from etils.epath import testing
  from orbax.checkpoint._src.path import gcs_utils

  from gshard_mt import io

  root = os.fspath(root)
  local = lambda p: os.path.join(root, os.fspath(p)[len(PREFIX):]) if os.fspath(p).startswith(PREFIX) else p
  remote = lambda p: PREFIX + os.path.relpath(p, root) if os.fspath(p).startswith(root + os.sep) else p
  one = lambda orig, p, *a, **k: orig(local(p), *a, **k)
  two = lambda orig, p, dst, *a, **k: orig(local(p), local(dst), *a, **k)
  glob = lambda orig, p: [remote(q) for q in orig(local(p))]
  walk = lambda orig, top, **k: ((remote(d), dirs, files) for d, dirs, files in orig(local(top), **k))
  with contextlib.ExitStack() as stack:
    stack.enter_context(testing.mock_epath(
        open=one, exists=one, isdir=one, listdir=one, makedirs=one, mkdir=one, remove=one, rmtree=one, stat=one,
        rename=two, replace=two, copy=two, glob=glob, walk=walk))
    stack.enter_context(mock.patch.dict(io.BACKENDS, gs=(("etils",), "gcsfs")))
    stack.enter_context(mock.patch.object(gcs_utils, "is_hierarchical_namespace_enabled", lambda path: False))
    stack.enter_context(mock.patch.object(gcs_utils, "get_kvstore_for_gcs",
                                          lambda path, *a, **k: {"driver": "file", "path": local(path)}))
    yield


if __name__ == "__main__":
  root, script, *args = sys.argv[1:]
  sys.argv = [script, *args]
  sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
  with mapped_gs(root):
    runpy.run_path(script, run_name="__main__")

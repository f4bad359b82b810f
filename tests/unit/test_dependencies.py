"""Every dependency that pyproject.toml declares for this platform (the package's and its `test` extra's) is
installed at a version it allows: the tests that need one (libtpu on Linux) then fail where it is missing, and
never skip silently."""

import importlib.metadata
import tomllib

from packaging.requirements import Requirement

from tests.helpers import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_every_dependency_declared_for_this_platform_is_installed():
  problems = []
  for requirement in map(Requirement, PROJECT["dependencies"] + PROJECT["optional-dependencies"]["test"]):
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": "test"}):
      continue  # declared for another platform (libtpu: Linux only)
    try:
      version = importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
      problems.append(f"{requirement}: not installed (pip install -e '.[test]')")
      continue
    if not requirement.specifier.contains(version, prereleases=True):
      problems.append(f"{requirement}: {version} installed")
  assert not problems, problems

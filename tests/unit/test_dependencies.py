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


def imported_distributions() -> set[str]:
  """The distributions (normalised names) of every top-level module that the package and its three commands import."""
  import ast
  import re
  import sys

  modules = set()
  for path in [*(ROOT / "gshard_mt").rglob("*.py"), *(ROOT / name for name in ("train.py", "eval.py", "translate.py"))]:
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        modules |= {alias.name.split(".")[0] for alias in node.names}
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        modules.add(node.module.split(".")[0])
  owners = importlib.metadata.packages_distributions()
  return {re.sub(r"[-_.]+", "-", dist).lower() for module in modules - set(sys.stdlib_module_names)
          for dist in owners.get(module, [])}


def test_every_declared_dependency_is_imported():
  """A dependency that nothing imports (grain was one) is only installed, never used: declared ones are used."""
  import re

  used = imported_distributions()
  unused = [r for r in map(Requirement, PROJECT["dependencies"]) if re.sub(r"[-_.]+", "-", r.name).lower() not in used]
  assert not unused, unused


def test_the_license_is_an_spdx_expression_that_the_build_backend_reads():
  """PEP 639's form (a TOML table is deprecated, and setuptools warns at every install); setuptools reads it from 77."""
  assert PROJECT["license"] == "Apache-2.0"
  build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
  setuptools = next(Requirement(r) for r in build["requires"] if Requirement(r).name == "setuptools")
  assert not setuptools.specifier.contains("76.9") and setuptools.specifier.contains("77.0")

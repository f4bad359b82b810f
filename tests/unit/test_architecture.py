"""The package's layers, read from its own imports: config -> the shared base (errors, io, ...) -> data, parallel
-> moe -> model -> kernels -> training -> evaluation -> tools. An import goes down the layers, never up or
sideways; no module imports itself back through others; the core packages import nothing inside a function, and
elsewhere an import inside a function is an optional dependency, saying so in a comment; the optional kernels
reach the core through one seam."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gshard_mt"
# Each unit's layer; a unit imports units of lower layers only (or its own modules). Top-level modules not named
# here are the shared base (errors, io, the registry, config_files, ...), above the config and below the rest.
LAYERS = {"config": 0, "base": 1, "data": 2, "parallel": 2, "moe": 3, "model": 4, "kernels": 5, "training": 6,
          "evaluation": 7, "tpu.estimates": 8, "hf": 8, "cli": 9, "tools": 10}
# Packages a function may import from above its own layer, when an option asks for them: the kernels.
OPTIONAL = ("kernels",)
# The core: no import inside a function, and no word of the optional kernels but through `ops.Ops`.
CORE = ("config", "data", "parallel", "moe", "model", "training")
SEAM = "gshard_mt.kernels.seam"  # the one module that picks the kernels, imported by training.setup only


def unit_of(module: str) -> str:
  """'gshard_mt.moe.layer' -> 'moe'; 'gshard_mt.tpu.estimates.hlo' -> 'tpu.estimates'; 'gshard_mt.io' -> 'base'."""
  parts = module.split(".")[1:]
  if parts[:1] == ["tpu"] and len(parts) > 1:
    return ".".join(parts[:2])
  return parts[0] if parts and parts[0] in LAYERS else "base"


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: pathlib.Path) -> list[tuple[str, bool, str]]:
  """(imported gshard_mt module, inside a function, its source lines and a comment line just above) of each
  import."""
  source = path.read_text()
  lines = source.splitlines()
  tree = ast.parse(source)
  inner = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
           for n in ast.walk(f) if isinstance(n, ast.Import | ast.ImportFrom)}
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names = [f"{node.module}.{a.name}" if _is_module(f"{node.module}.{a.name}") else node.module
               for a in node.names]
    else:
      continue
    before = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
    text = " ".join([before] * before.startswith("#") + lines[node.lineno - 1:node.end_lineno])
    found += [(name, id(node) in inner, text) for name in names]
  return found


def _is_module(name: str) -> bool:
  path = PACKAGE.parent.joinpath(*name.split("."))
  return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def graph() -> dict[str, list[tuple[str, bool, str]]]:
  return {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def edges():
  """(module, the gshard_mt module it imports, inside a function, the import's text)."""
  for module, found in graph().items():
    for target, in_function, text in found:
      if target.startswith("gshard_mt."):
        yield module, target, in_function, text


def test_imports_only_go_down_the_layers():
  wrong = []
  for module, target, in_function, text in edges():
    a, b = unit_of(module), unit_of(target)
    optional = in_function and b in OPTIONAL and "optional" in text
    if a != b and LAYERS.get(b, 0) >= LAYERS.get(a, 0) and not optional:
      wrong.append(f"{module} ({a}) imports {target} ({b})")
  assert not wrong, "\n".join(wrong)


def test_no_module_imports_itself_back():
  g: dict[str, set[str]] = {}
  for module, target, in_function, _ in edges():
    if not (in_function and unit_of(target) in OPTIONAL):
      g.setdefault(module, set()).add(target)
  state: dict[str, int] = {}
  cycles = []

  def visit(node, path):
    state[node] = 1
    for nxt in sorted(g.get(node, ())):
      if state.get(nxt) == 1:
        cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
      elif nxt not in state:
        visit(nxt, path + [nxt])
    state[node] = 2

  for node in sorted(g):
    if node not in state:
      visit(node, [node])
  assert not cycles, "\n".join(cycles)


def test_imports_inside_functions_are_optional_dependencies_and_say_so():
  unmarked = [f"{module}: {text.strip()}" for module, found in graph().items() for _, in_function, text in found
              if in_function and "optional" not in text]
  assert not unmarked, "\n".join(unmarked)


def test_the_core_imports_none_of_the_package_inside_a_function():
  inside = [f"{module}: {text.strip()}" for module, target, in_function, text in edges()
            if in_function and unit_of(module) in CORE]
  assert not inside, "\n".join(inside)


def test_the_core_reaches_the_kernels_through_one_seam():
  """The core names no kernel and imports the kernels' folder only through the seam: where the train state is built
  (the kernels it picks) and where the config is validated (the options they serve)."""
  named = [f"{p.relative_to(PACKAGE.parent)}:{i}" for p in sorted(PACKAGE.rglob("*.py"))
           if unit_of(module_name(p)) in CORE for i, line in enumerate(p.read_text().splitlines(), 1)
           if any(word in line for word in ("pallas", "kernel_vmem", "gshard_mt.tpu"))]
  assert not named, "\n".join(named)
  imported = {(m, t) for m, t, _, _ in edges() if unit_of(m) in CORE and unit_of(t) == "kernels"}
  assert imported == {("gshard_mt.training.setup", SEAM), ("gshard_mt.training.validate", SEAM)}


def test_the_config_is_a_leaf():
  """gshard_mt/config imports nothing else of the package, and names no module of it in a string (no registry that
  imports code by name)."""
  config = [(m, t) for m, t, _, _ in edges() if unit_of(m) == "config" and unit_of(t) != "config"]
  assert not config, config
  named = [f"{p.name}:{i}" for p in sorted((PACKAGE / "config").glob("*.py"))
           for i, line in enumerate(p.read_text().splitlines(), 1) if '"gshard_mt.' in line or "'gshard_mt." in line]
  assert not named, named


@pytest.mark.parametrize("module", ["gshard_mt.config"])
def test_the_config_loads_without_jax(module, tmp_path):
  import subprocess
  import sys

  code = f"import sys, {module}; sys.exit(1 if 'jax' in sys.modules or 'flax' in sys.modules else 0)"
  assert subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent).returncode == 0


def test_the_checks_see_a_wrong_import(tmp_path, monkeypatch):
  (tmp_path / "gshard_mt" / "config").mkdir(parents=True)
  (tmp_path / "gshard_mt" / "moe").mkdir()
  (tmp_path / "gshard_mt" / "config" / "__init__.py").write_text("from gshard_mt.moe import layer\n")
  (tmp_path / "gshard_mt" / "moe" / "layer.py").write_text("def f():\n  from gshard_mt import config\n")
  monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "PACKAGE", tmp_path / "gshard_mt")
  with pytest.raises(AssertionError, match="gshard_mt.config \\(config\\) imports gshard_mt.moe.layer"):
    test_imports_only_go_down_the_layers()
  with pytest.raises(AssertionError, match="gshard_mt.config -> gshard_mt.moe.layer -> gshard_mt.config"):
    test_no_module_imports_itself_back()
  with pytest.raises(AssertionError, match="gshard_mt.moe.layer: from gshard_mt import config"):
    test_imports_inside_functions_are_optional_dependencies_and_say_so()


def sizes(package: pathlib.Path) -> tuple[dict[str, int], dict[str, int]]:
  """({module: lines}, {module.function: lines}) of every module and function (methods and nested ones too)."""
  modules, functions = {}, {}
  for path in sorted(package.rglob("*.py")):
    source = path.read_text()
    modules[module_name(path)] = len(source.splitlines())
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        functions[f"{module_name(path)}.{node.name}:{node.lineno}"] = node.end_lineno - node.lineno + 1
  return modules, functions


def test_modules_and_functions_read_in_one_sitting():
  modules, functions = sizes(PACKAGE)
  assert not {m: n for m, n in modules.items() if n > 300}, "modules over 300 lines"
  assert not {f: n for f, n in functions.items() if n > 60}, "functions over 60 lines"


def test_the_size_checks_see_a_long_module(tmp_path, monkeypatch):
  (tmp_path / "gshard_mt").mkdir()
  body = "".join(f"  x{i} = {i}\n" for i in range(61))
  (tmp_path / "gshard_mt" / "long.py").write_text("def f():\n" + body + "\n" * 240)
  monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "PACKAGE", tmp_path / "gshard_mt")
  modules, functions = sizes(tmp_path / "gshard_mt")
  assert modules == {"gshard_mt.long": 302} and functions == {"gshard_mt.long.f:1": 62}
  with pytest.raises(AssertionError, match="modules over 300 lines"):
    test_modules_and_functions_read_in_one_sitting()

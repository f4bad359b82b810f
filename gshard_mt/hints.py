"""The commands that messages suggest, written the way this process was started, so that each works as printed:
through make (`make train WORKDIR=runs/tiny-2 ARGS="--config.moe.num_experts=8"`) when make started it, else as the
python command line it was started with (`python train.py --config ... --workdir runs/tiny-2 ...`).

make says so in the environment of its recipes (MAKELEVEL); the Makefile's recipes say which make variable carries
which argument of which program (`$(PY) train.py --config $(CONFIG) --workdir $(WORKDIR) $(ARGS)`), and its `?=`
lines their defaults, which a hint leaves out.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import re
import shlex
import sys

from gshard_mt import io

MAKEFILE = pathlib.Path(__file__).resolve().parents[1] / "Makefile"
TRAIN, SWEEP = "train.py", "gshard_mt.tools.sweep"  # the programs that read config files and sweep files
Changes = dict[str, "str | bool | None"]  # an argument's new value; True: a flag without one; None: left out


@dataclasses.dataclass(frozen=True)
class Recipe:
  """A Makefile target that runs a program: `variables` {flag: the make variable of its value}, `fixed` the flags
  it passes with a value of its own, `defaults` {variable: its default}."""

  target: str
  variables: dict[str, str]
  fixed: frozenset[str]
  defaults: dict[str, str]


@functools.cache
def recipes(makefile: pathlib.Path = MAKEFILE) -> dict[str, Recipe]:
  """{program ('train.py', 'gshard_mt.tools.sweep'): its Recipe} of the Makefile's `$(PY) ... $(ARGS)` lines."""
  if not makefile.is_file():
    return {}
  text = makefile.read_text()
  defaults = dict(re.findall(r"^(\w+) \?= *(.*?) *$", text, re.M))
  found, target = {}, None
  for line in text.splitlines():
    if match := re.match(r"^([\w-]+):", line):
      target = match[1]
    elif match := re.match(r"^\t@?\$\(PY\) (?:-m )?(\S+) (.*)\$\(ARGS\)\s*$", line):
      pairs = re.findall(r"(--\w+) (\S+)", match[2])
      variables = {flag: value[2:-1] for flag, value in pairs if value.startswith("$(")}
      fixed = frozenset(flag for flag, value in pairs if flag not in variables)
      found.setdefault(match[1], Recipe(target, variables, fixed, {v: defaults.get(v, "") for v in variables.values()}))
  return found


def by_make() -> bool:
  """Whether make started this process: make puts MAKELEVEL in the environment of every recipe."""
  return "MAKELEVEL" in os.environ


def started() -> tuple[list[str], list[str], list[str]]:
  """(the interpreter and its options as typed, the program: [script] or ['-m', module], its arguments)."""
  args = sys.argv[1:]
  head = sys.orig_argv[: len(sys.orig_argv) - len(args)]  # ['python', 'train.py'] or ['python', '-m', 'mod']
  cut = len(head) - (2 if len(head) >= 3 and head[-2] == "-m" else 1)
  return head[:cut], head[cut:], args


def program() -> str:
  """How this process's messages name it: 'python -m gshard_mt.tools.extract' for a module, 'train.py' for a script
  (its name alone, as argparse names one, however its path was typed)."""
  _, current, _ = started()
  return f"python -m {current[-1]}" if current[0] == "-m" else os.path.basename(current[-1])


def parse(args: list[str]) -> dict[str, str | bool]:
  """{'--flag': its value, or True for a flag without one} of a command line (`--k v` and `--k=v` alike)."""
  out, i = {}, 0
  while i < len(args):
    flag, equals, value = args[i].partition("=")
    if not equals and i + 1 < len(args) and not args[i + 1].startswith("--"):
      value, i = args[i + 1], i + 1
    out[flag] = value if equals or value else True
    i += 1
  return out


def join(args: dict[str, str | bool | None]) -> list[str]:
  """`parse`'s inverse (`--config.key=value`, `--flag value`); flags set to None are left out."""
  out = []
  for flag, value in args.items():
    if value is True:
      out.append(flag)
    elif value is not None:
      out += [f"{flag}={value}"] if flag.startswith("--config.") else [flag, str(value)]
  return out


def command(changes: Changes | None = None, *, program: str | None = None, keep: bool | None = None) -> str:
  """This process's command with `changes` made to its arguments; with `program` (a script 'train.py' or a module
  'gshard_mt.tools.sweep') that program's command. `keep`: whether this process's arguments are kept, or the
  `changes` alone make the command (default: kept for this process's own program only). Through make where make
  started this process and the Makefile runs the program, else as python."""
  interpreter, current, args = started()
  name = program or os.path.basename(current[-1])
  args = {**(parse(args) if (program is None if keep is None else keep) else {}), **(changes or {})}
  recipe = recipes().get(name)
  if by_make() and recipe:
    return _make(recipe, args)
  runs = current if program is None else [program] if program.endswith(".py") else ["-m", program]
  return shlex.join([*interpreter, *runs, *join(args)])


def _make(recipe: Recipe, args: dict) -> str:
  words = ["make", recipe.target]
  for flag, variable in recipe.variables.items():
    value = args.get(flag)
    if value not in (None, True) and value != recipe.defaults[variable]:
      words.append(shlex.quote(f"{variable}={value}"))
  rest = shlex.join(join({k: v for k, v in args.items() if k not in recipe.variables and k not in recipe.fixed}))
  if rest:  # in double quotes as the README writes them, where nothing in them means more there
    words.append(f'ARGS="{rest}"' if not set(rest) & set('"$`\\') else shlex.quote(f"ARGS={rest}"))
  return " ".join(words)


def unused(directory: io.PathLike) -> str:
  """A directory beside `directory` that does not exist yet: `runs/tiny-2` (or -3, ...)."""
  base = os.fspath(directory).rstrip("/")
  return next(f"{base}-{i}" for i in range(2, 1000) if not io.path(f"{base}-{i}").exists())

"""Errors a user can fix. Every entry point prints their one-line message and exits with status 2
(`gshard_mt.cli.run`); the message names the file (and line), the config key or the directory at fault."""

import difflib

from gshard_mt.config.errors import ConfigError, UserError, article  # noqa: F401 - the root, in the leaf

LISTED_WHOLE = 12  # known names a message lists; of more it gives the number and the command that lists them


class DataError(UserError):
  """Bad input data: the message names the file (and line) or the config key."""


class WorkdirError(UserError):
  """A work directory, checkpoint, language or baseline that cannot be used; the message says why."""


def one_line(error: BaseException) -> str:
  """'ExceptionType: the first line of its message' (200 characters at most), for a report that goes on."""
  return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"


def counted(n: int, singular: str, plural: str | None = None) -> str:
  """'1 process', '2 processes' (plural: singular + 's' unless given)."""
  return f"{n} {singular if n == 1 else plural or singular + 's'}"


def close_matches(given: list[str], known: list[str]) -> str:
  """'did you mean fra, fry? ' for the known names close to the given ones ('' when none is)."""
  close = sorted({match for name in given for match in difflib.get_close_matches(name, known, n=3)})
  return f"did you mean {', '.join(close)}? " if close else ""


def listed(known: list[str], noun: str, lister: str) -> str:
  """The known names, or where there are more than LISTED_WHOLE their number and `lister`, the command that lists
  them ('112 languages (python translate.py --workdir runs/tiny --list_languages lists them)')."""
  return ", ".join(known) if len(known) <= LISTED_WHOLE else f"{len(known)} {noun} ({lister} lists them)"

"""Errors a user can fix. Every entry point prints their one-line message and exits with status 2
(`gshard_mt.cli.run`); the message names the file (and line), the config key or the directory at fault."""


class UserError(ValueError):
  """Bad input: a config, a corpus, a work directory or a command-line argument."""


class ConfigError(UserError):
  """A config key has a bad or impossible value; the message names the key."""


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


def article(word: str) -> str:
  """'an int', 'a float' (by the first letter)."""
  return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"

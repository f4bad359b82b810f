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


def one_line(error: BaseException, limit: int = 200) -> str:
  """'ExceptionType: the first line of its message' (at most `limit` characters of it), for a report that goes on
  after the error."""
  return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:limit]}"

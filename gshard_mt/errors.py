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

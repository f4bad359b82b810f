"""The root of every error a user can fix, here in the config (the package's leaf) so that the config's own
checks raise it; `gshard_mt.errors` adds the others (a corpus's, a work directory's)."""


class UserError(ValueError):
  """Bad input: a config, a corpus, a work directory or a command-line argument."""


class ConfigError(UserError):
  """A config key has a bad or impossible value; the message names the key."""


def article(word: str) -> str:
  """'an int', 'a float' (by the first letter)."""
  return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"

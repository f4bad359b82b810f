"""The config that config files start from: `get_config()`, every key at its default (the defaults, their checks
and their comments are the dataclasses of `gshard_mt.config.sections`), as a ConfigDict that a file edits."""

import dataclasses

import ml_collections

from gshard_mt.config import sections


def get_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dataclasses.asdict(sections.Config()))

"""Each extension point is one class registered by name: a data source, a learning-rate schedule and a router,
each defined and registered in this file, trains two steps of configs/tiny.py (shrunk as the other tests shrink
it) with no module of the package changed."""

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.data import corpus
from gshard_mt.data.sources import SOURCES, Part, Source
from gshard_mt.moe import gating
from gshard_mt.moe.routers import ROUTERS, Router
from gshard_mt.training import loop
from gshard_mt.training.schedules import SCHEDULES, Schedule
from tests.helpers import small_config

pytestmark = pytest.mark.slow  # trains

SYLLABLES = ("ka", "lo", "mi", "nu", "pe", "ri", "so", "tu", "va", "ze")


class Syllables(Source):
  """Two made-up languages ('xxa', 'xxb') of seeded syllable words, each sentence paired with its reverse as the
  English side: no file is read."""

  def parts(self, data_config, arg, languages):
    return [Part(self.name, type(self), (lang,)) for lang in ("xxa", "xxb") if not languages or lang in languages]

  @staticmethod
  def files(part):
    return []

  @staticmethod
  def read(part, settings):
    (lang,) = part.args
    rng = np.random.default_rng(sum(map(ord, lang)))
    words = ["".join(rng.choice(SYLLABLES, size=rng.integers(1, 4))) for _ in range(3000)]
    src = [" ".join(words[i:i + 5]) for i in range(0, 3000, 5)]
    pairs = corpus.Pairs(src, [" ".join(reversed(s.split())) for s in src], f"syllables ({lang})")
    return corpus.split_corpus({lang: pairs}, *settings), 0


class LinearToZero(Schedule):
  """The warmed-up rate falling linearly to 0 at the run's last step: it needs the total steps."""

  def decay(self, lr, step):
    return lr * jnp.maximum(0.0, 1.0 - step / self.total_steps)


@dataclasses.dataclass(frozen=True)
class LeastLikely(Router):
  """Each token to its k least likely experts (a perverse router, so that the test shows the router is the one
  asked for: the kept load then follows the lowest logits)."""

  k: int = 2

  def route(self, logits, capacity, *, padding_mask=None, rng=None, bias=None):
    return gating.topk_gating(-logits, self.k, capacity, bias=bias, padding_mask=padding_mask)


@pytest.fixture
def registered():
  """Registers the classes above (and takes them out again after the test)."""
  added = [(SOURCES, "syllables", Syllables), (SCHEDULES, "linear_to_zero", LinearToZero),
           (ROUTERS, "least_likely", LeastLikely)]
  for registry, name, cls in added:
    registry.register(name)(cls)
  yield
  for registry, name, _ in added:
    registry.unregister(name)


def metrics(workdir) -> list[dict]:
  return [json.loads(line) for line in open(workdir / "metrics.jsonl") if '"loss"' in line]


def test_a_data_source_defined_here_trains(registered, tmp_path):
  config = small_config(**{"num_train_steps": 2, "data.source": "syllables", "data.languages": "",
                           "data.vocab_size": 400})
  result = loop.train_and_evaluate(config, tmp_path / "run")
  assert result["step"] == 2 and all(np.isfinite(r["loss"]) for r in metrics(tmp_path / "run"))
  streams = json.loads(next((tmp_path / "run" / "tokenizer").glob("spm-*/manifest.json")).read_text())
  assert "xxa" in json.dumps(streams) and "fra" not in json.dumps(streams)


def test_a_schedule_defined_here_trains_with_the_total_steps(registered, workdir):
  config = small_config(**{"num_train_steps": 2, "optimizer.schedule": "linear_to_zero",
                           "optimizer.warmup_steps": 1, "optimizer.learning_rate": 0.5})
  result = loop.train_and_evaluate(config, workdir)
  assert result["step"] == 2
  # 0.5 x (1 - 1 / 2) for the updates from steps 0 and 1 (a schedule counts step 0 as step 1): the total steps
  # reached the schedule (constant would give 0.5)
  assert [r["learning_rate"] for r in metrics(workdir)] == pytest.approx([0.25, 0.25])


def test_a_router_defined_here_trains(registered, workdir):
  config = small_config(**{"num_train_steps": 2, "moe.router": "least_likely", "moe.num_selected": 1})
  result = loop.train_and_evaluate(config, workdir)
  rows = metrics(workdir)
  assert result["step"] == 2 and all(np.isfinite(r["loss"]) for r in rows)
  assert "moe/encoder_0/top1_dropped" in rows[0]  # logged as every router's metrics are


def test_an_unknown_name_is_a_one_line_error_naming_the_choices():
  from gshard_mt.errors import ConfigError

  with pytest.raises(ConfigError, match=r"optimizer.schedule='linear_to_zero': expected one of \('constant', "):
    small_config(**{"optimizer.schedule": "linear_to_zero"})

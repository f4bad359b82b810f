"""The documents against the code: docs/config.md lists every config key with its default, docs/performance.md is
what bench/report.py writes from bench/results/, the README stays short, and the documents' links lead somewhere."""

import ast
import dataclasses
import re
import sys

import numpy as np
import pytest

from gshard_mt import cli
from gshard_mt.config.defaults import get_config
from gshard_mt.config.moe import MoeConfig
from gshard_mt.moe.routers import ROUTERS
from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import report  # noqa: E402  (bench/report.py)

CONFIG_DOC = ROOT / "docs" / "config.md"
ROW = re.compile(r"^\| `([a-z_][a-z0-9_.]*)` \| `(.*?)` \|")


def flatten(tree, prefix=""):
  """{'a.b': value} of a ConfigDict, dict or dataclass tree."""
  if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
    tree = dataclasses.asdict(tree)
  if hasattr(tree, "to_dict"):
    tree = tree.to_dict()
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict) or hasattr(value, "to_dict") or dataclasses.is_dataclass(value):
      out |= flatten(value, f"{prefix}{key}.")
    else:
      out[prefix + key] = value
  return out


def documented(text: str) -> dict:
  """{key: default} of the document's table rows `| `key` | `default` | meaning |`."""
  rows = {}
  for line in text.splitlines():
    if m := ROW.match(line):
      assert m.group(1) not in rows, f"docs/config.md lists {m.group(1)} twice"
      rows[m.group(1)] = ast.literal_eval(m.group(2))
  return rows


def differences(doc: dict, defaults: dict) -> list[str]:
  problems = [f"{k}: not in docs/config.md (default {defaults[k]!r})" for k in defaults if k not in doc]
  problems += [f"{k}: in docs/config.md, not in the config" for k in doc if k not in defaults]
  problems += [f"{k}: docs/config.md says {doc[k]!r}, the code {defaults[k]!r}" for k in doc
               if k in defaults and (doc[k] != defaults[k] or type(doc[k]) is not type(defaults[k]))]
  return problems


def test_every_config_key_is_documented_with_its_default():
  assert differences(documented(CONFIG_DOC.read_text()), flatten(get_config())) == []


def test_the_moe_rows_are_moe_config():
  moe = {f"moe.{f.name}": f.default for f in dataclasses.fields(MoeConfig)}
  doc = {k: v for k, v in documented(CONFIG_DOC.read_text()).items() if k.startswith("moe.")}
  assert differences(doc, moe) == []


def test_the_check_fails_on_a_missing_key_or_another_default():
  text = CONFIG_DOC.read_text()
  defaults = flatten(get_config())
  missing = "\n".join(line for line in text.splitlines() if not line.startswith("| `moe.num_experts` |"))
  assert differences(documented(missing), defaults) == ["moe.num_experts: not in docs/config.md (default 32)"]
  changed = text.replace("| `data.temperature` | `5.0` |", "| `data.temperature` | `1.0` |")
  assert differences(documented(changed), defaults) == ["data.temperature: docs/config.md says 1.0, the code 5.0"]
  typed = text.replace("| `data.temperature` | `5.0` |", "| `data.temperature` | `5` |")
  assert differences(documented(typed), defaults) == ["data.temperature: docs/config.md says 5, the code 5.0"]
  extra = text + "\n| `model.nope` | `1` | no such key |\n"
  assert differences(documented(extra), defaults) == ["model.nope: in docs/config.md, not in the config"]


def test_performance_md_is_what_bench_report_writes():
  assert (ROOT / "docs" / "performance.md").read_text() == report.render(), (
      "docs/performance.md differs from bench/report.py's output: run `python bench/report.py`")


def test_every_result_file_has_a_source(tmp_path):
  """A JSON result without its environment and command, and not in sources.json, is refused."""
  (tmp_path / "sources.json").write_text("{}")
  (tmp_path / "x.json").write_text('{"points": []}')
  with pytest.raises(ValueError, match="x.json: no environment and command"):
    report.load(tmp_path)


def test_the_path_of_a_key_is_true():
  """docs/config.md's path of moe.num_experts: each call after an arrow is a function or class of the files it
  lists, the count of calls and files is what it says, and the einsum it ends at is in the MoE layer."""
  text = CONFIG_DOC.read_text()
  section = text[text.index("**How a key reaches the code**"):text.index("Every key below")]
  steps = section[section.index("\n1. "):section.index("\n\nThe checks on the way")]
  outside = steps.split("`")[::2]  # the text between backticked spans: the einsum's own arrow is inside one
  called = re.findall(r"-> (?:`[\w/.]+\.py`\s+)?`([\w.]+)", steps)  # a file named, then what is called there
  calls, files = (int(n) for n in re.search(r"(\d+) calls over\s+(\d+) files", section).groups())
  carried = " ".join(re.search(r"carried through are (.*?):", section, re.S).group(1).split())
  listed = re.split(r",\s+|\s+and\s+", carried)
  sources = {name: (ROOT / (name if name == "train.py" else f"gshard_mt/{name}")).read_text() for name in listed}
  assert sum(part.count("->") for part in outside) == len(called) == calls
  assert len(listed) == files
  undefined = [name for name in called if not any(re.search(rf"^\s*(def|class) {name.split('.')[-1]}\b", source, re.M)
                                                  for source in sources.values())]
  assert not undefined, f"docs/config.md's path calls {undefined}, defined in none of {listed}"
  assert 'einsum("GSM,ME->GSE"' in sources["moe/layer.py"]


def test_the_readme_is_short():
  assert len((ROOT / "README.md").read_text().splitlines()) <= 300


@pytest.mark.parametrize("doc", ["README.md", *[f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))]])
def test_relative_links_lead_to_files(doc):
  path = ROOT / doc
  links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
  missing = [link for link in links if "://" not in link and not (path.parent / link).exists()]
  assert missing == []


@pytest.mark.parametrize("best, labels, expected", [
    ("x", {"runner-up": False, "today's default": True}, "yes"),
    ("x", {"runner-up, today's default": False}, "no"),  # gshard second: one entry, both labels
    ("gshard", {"runner-up": True, "dense twin": True}, "- (gshard is the best)"),
    ("x", {"runner-up": True}, "- (no gshard point)"),
])
def test_the_router_tables_lead_over_gshard_wherever_the_study_files_it(best, labels, expected):
  verdict = {"best": best, "against": {label: {"beyond_noise": flag} for label, flag in labels.items()}}
  assert report.lead_over_default(verdict) == expected


def test_the_readmes_router_registers_and_routes():
  """The README's example router, run as written: it registers under 'mine', routes each token to its k experts,
  and the validation accepts `moe.router=mine`."""
  block = re.search(r"```python\n(import dataclasses\n.*?@ROUTERS.register.*?)```", (ROOT / "README.md").read_text(),
                    re.S)
  try:
    exec(block[1], {})  # noqa: S102 - the document's own code
    logits = np.arange(16, dtype=np.float32).reshape(1, 4, 4) % 5  # [G, S, E]
    routing = ROUTERS.get("mine")(k=2).route(logits, 4)
    assert routing.expert_index.shape == (1, 4, 2) and bool(routing.kept.all())
    np.testing.assert_array_equal(routing.expert_index[..., 0], logits.argmax(-1))
    cli.load(ROOT / "configs/tiny.py", {"moe.router": "mine"})
  finally:
    ROUTERS.unregister("mine")

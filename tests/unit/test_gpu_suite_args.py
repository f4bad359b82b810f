"""bench/gpu_suite.py's choice of sections and training runs: bad names end before any work, and the tables it
prints hold only what ran."""

import json
import sys

import pytest

from gshard_mt.errors import UserError
from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import gpu_suite  # noqa: E402


@pytest.mark.parametrize("argv, message", [
    (["--sections", "training,profiles"], "--sections: unknown section 'profiles'"),
    (["--runs", "base:nope"], "--runs: 'base:nope' is not config:variant"),
    (["--runs", "tiny:defaults"], "--runs: 'tiny:defaults' is not config:variant"),
    (["--runs", "dense_base"], "--runs: 'dense_base' is not config:variant"),
    (["--sections", "profile", "--runs", "base:defaults"], "--runs chooses the training section's steps"),
    (["--sections", "profile", "--profiles", "base,tiny"], "--profiles: 'base,tiny' names a config not of"),
])
def test_bad_choices_end_before_any_work(argv, message, tmp_path):
  with pytest.raises(UserError, match=message):
    gpu_suite.main(argv + ["--out", str(tmp_path)])
  assert list(tmp_path.iterdir()) == []


def test_markdown_holds_only_the_sections_that_ran():
  row = dict(config="configs/dense_base.py", variant="defaults", step_ms=50.0, mfu=0.2, tokens_per_s=1e6,
             batch_size=512, row_lengths=[64, 40], losses=[9.0, 7.25])
  result = dict(environment=dict(device="GPU", date="2026-11-25", device_count=1, platform="gpu", jax="0.11.2",
                                 flax="0.12.10", commit="abc", xla_flags=""),
                command="python bench/gpu_suite.py --sections training", seconds=60, json="x.json",
                training=[row, row | dict(variant="scanned", step_ms=70.0),
                          row | dict(variant="all", losses=[9.0, 9.0], skipped_steps=30)])
  text = gpu_suite.markdown(result)
  assert ("| configs/dense_base.py | scanned | 512 x 64 / 40 | 70.0 | 1.40x | 1,000,000 | 20.0% | 9.000 -> 7.250 |"
          in text)
  assert "| 9.000 -> 9.000 (30 updates skipped: not finite) |" in text
  assert "MoE layer" not in text and "Decoding" not in text and "Profile" not in text
  assert "Command: `python bench/gpu_suite.py --sections training`" in text


def test_a_failed_profile_is_said_below_its_heading():
  result = dict(environment=dict(device="GPU", date="2026-11-25", device_count=1, platform="gpu", jax="0.11.2",
                                 flax="0.12.10", commit="abc", xla_flags=""),
                command="python bench/gpu_suite.py --sections profile", seconds=60, json="x.json",
                profile=[dict(config="configs/base.py", error="RuntimeError: out of memory")])
  lines = gpu_suite.markdown(result).splitlines()
  heading = lines.index("Profile of the training step, traced (device time per step by part of the model):")
  assert lines[heading + 1:heading + 3] == ["", "configs/base.py: failed (RuntimeError: out of memory)."]


def test_the_tables_of_a_run_a_time_limit_stopped(tmp_path, capsys):
  """A run stopped after its first training step left its JSON (written after each step): --from_json prints its
  tables, which say so, and writes nothing."""
  row = dict(config="configs/dense_base.py", variant="defaults", step_ms=50.0, mfu=0.2, tokens_per_s=1e6,
             batch_size=512, row_lengths=[64, 40], losses=[9.0, 7.25])
  result = dict(environment=dict(device="GPU", date="2026-11-26", device_count=1, platform="gpu", jax="0.11.2",
                                 flax="0.12.10", commit="abc", xla_flags=""),
                command="python bench/gpu_suite.py", seconds=600, json="x.json", finished=False, training=[row])
  (tmp_path / "x.json").write_text(json.dumps(result))
  assert gpu_suite.main(["--from_json", str(tmp_path / "x.json")]) == 0
  text = capsys.readouterr().out
  assert "(10.0 minutes, stopped before the end: the sections below ran)" in text
  assert "| configs/dense_base.py | defaults | 512 x 64 / 40 | 50.0 | 1.00x |" in text
  assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]

"""bench/cache_start.py's reading of a start: the time to train.py's first-step line, the programs the cache gave,
and the timeline of the lines before it; a process without that line is an error showing its last lines."""

import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import cache_start  # noqa: E402


def fake_train(*lines: str, sleep: float = 0.0) -> list[str]:
  """A process printing `lines` (a pause of `sleep` seconds before the last one), then hanging as train.py would."""
  code = (f"import sys, time\nfor line in {list(lines[:-1])!r}: print(line, flush=True)\ntime.sleep({sleep})\n"
          f"print({lines[-1]!r}, flush=True)\ntime.sleep(60)")
  return [sys.executable, "-c", code]


def test_the_first_step_line_ends_the_timing_and_the_process():
  command = fake_train("data: ready", "Finished tracing train_step for jit in 0.5 sec",
                       "step 1: compiled and ran in 2.5 s (compilation cache: 2 programs loaded, 0 written)",
                       sleep=0.3)
  run = cache_start.first_step(command, timeout=30)
  assert run["step_line_seconds"] == 2.5 and (run["loaded"], run["written"]) == (2, 0)
  assert 0.3 <= run["seconds"] < 30  # killed at the line, not after its 60 s
  assert [line for _, line in run["timeline"]] == ["data: ready", "Finished tracing train_step for jit in 0.5 sec",
                                                   run["timeline"][-1][1]]
  times = [t for t, _ in run["timeline"]]
  assert times == sorted(times) and times[-1] - times[1] >= 0.3 - 0.01  # each time rounded to 0.01 s


def test_a_run_without_the_cache_counts_loads_nothing():
  run = cache_start.first_step(fake_train("step 7: compiled and ran in 1.0 s"), timeout=30)
  assert (run["step_line_seconds"], run["loaded"], run["written"]) == (1.0, 0, 0)


def test_no_first_step_line_is_an_error_with_the_last_lines():
  command = [sys.executable, "-c", "print('Traceback: the config is wrong'); raise SystemExit(2)"]
  with pytest.raises(RuntimeError, match=r"no first-step line .*\(exit (2|None)\):\nTraceback: the config is wrong"):
    cache_start.first_step(command, timeout=30)

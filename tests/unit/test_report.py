"""The readable forms of the scores: the Markdown report, the console summary and the plot."""

import pytest

from gshard_mt.evaluation import report
from tests.helpers import started_as
from tests.unit.test_hints import train_argv


def scores(num_languages=3, baseline=False):
  languages = {f"l{i:02d}": {"train_pairs": 100 * i, "resource": "low" if i < 2 else "high", "sentences": 10 + i,
                             "bleu": 10.0 + i, "chrf": 30.0 + i, "bleu_interval": [9.5 + 0.5 * i, 10.5 + i]}
               for i in range(num_languages)}  # l01 and l02 hold the average, 11
  out = {"split": "test", "step": 6, "workdir": "runs/x", "languages": languages,
         "average": {"bleu": 11.0, "chrf": 31.0},
         "by_resource": {"high": {"bleu": 12.0, "chrf": 32.0}, "low": {"bleu": 10.5, "chrf": 30.5}},
         "decoding": {"beam_size": 4, "alpha": 0.6, "max_decode_len": 24, "sentences_per_s": 12.34,
                      "tokens_per_s": 456.7},
         "signatures": {"bleu": "nrefs:1|bleu-sig", "chrf": "nrefs:1|chrf-sig"}}
  if baseline:
    out["baseline"] = "runs/dense"
    out["average"]["delta_bleu"] = 1.5
    for s in [*out["languages"].values(), *out["by_resource"].values()]:
      s["delta_bleu"] = -0.25
  return out


def table(md, header_start):
  """The rows of the Markdown table whose header starts with `header_start`."""
  lines = md.splitlines()
  i = next(i for i, line in enumerate(lines) if line.startswith(header_start))
  rows = []
  for line in lines[i + 2:]:
    if not line.startswith("|"):
      break
    rows.append([cell.strip() for cell in line.strip("|").split("|")])
  return rows


def test_markdown_tables():
  md = report.markdown(scores())
  assert md.splitlines()[0] == "# test split, step 6 (runs/x)"
  assert "Average over 3 languages: BLEU 11.00, chrF++ 31.00" in md
  assert "beam 4, α 0.6, max length 24, 12.3 sentences/s, 457 tokens/s" in md
  assert table(md, "| language") == [["l02", "200", "high", "12", "12.00", "10.50-12.50", "≈", "32.00"],  # best first
                                     ["l01", "100", "low", "11", "11.00", "10.00-11.50", "≈", "31.00"],
                                     ["l00", "0", "low", "10", "10.00", "9.50-10.50", "", "30.00"]]
  assert ("≈: the interval holds the average BLEU (11.00), so this test set cannot tell the language's score from "
          "the average (2 of 3 languages)") in md
  assert "does not translate" not in md
  assert table(md, "| resource") == [["high", "12.00", "32.00"], ["low", "10.50", "30.50"]]
  assert "`nrefs:1|bleu-sig`" in md and "ΔBLEU" not in md


def test_markdown_with_a_baseline_has_delta_columns():
  md = report.markdown(scores(baseline=True))
  assert "ΔBLEU +1.50 against runs/dense" in md
  assert table(md, "| language")[0] == ["l02", "200", "high", "12", "12.00", "10.50-12.50", "≈", "32.00", "-0.25"]
  assert table(md, "| resource")[1] == ["low", "10.50", "30.50", "-0.25"]


def test_summary_shows_the_best_and_worst_languages():
  lines = report.summary(scores(num_languages=12), show=2).splitlines()
  assert lines[0] == "test step 6: average BLEU 11.00, chrF++ 31.00 over 12 languages"
  assert [line.split()[0] for line in lines[2:-2]] == ["l11", "l10", "...", "l01", "l00"]
  assert lines[2] == "l11     21.00  15.00-21.50    41.00         21  high"  # its interval does not hold 11
  assert lines[-2].startswith("≈: 3 of 12 languages hold the average BLEU in their 95% interval")
  assert lines[-1] == "decoding: 12.3 sentences/s, 457 tokens/s"
  assert len(report.summary(scores(num_languages=4), show=2).splitlines()) == 2 + 4 + 2  # all shown: no "..."


def test_an_interval_marks_a_language_whose_bounds_hold_the_average():
  language = {"bleu_interval": [1.0, 2.0]}
  assert report.like_average(language, 1.0) and report.like_average(language, 2.0)
  assert not report.like_average(language, 2.01) and not report.like_average(language, 0.99)


@pytest.mark.parametrize("make", [False, True])
def test_a_model_that_does_not_translate_says_so_and_what_to_train(make, monkeypatch):
  started_as(monkeypatch, [".venv/bin/python" if make else "python", "eval.py", "--workdir", "runs/tiny"], make=make)
  low = scores()
  low["average"]["bleu"] = 0.8
  note = report.summary(low).splitlines()[-1]
  assert note.startswith("average BLEU 0.80: this model does not translate yet (the default run, configs/tiny.py, "
                         "is a smoke test: it learns, but it does not translate). For translations train "
                         "configs/multi30k.py: ")
  args = train_argv(note.split("configs/multi30k.py: ")[1].split(" (test BLEU")[0], make)
  assert args == ["--config", "configs/multi30k.py", "--workdir", "runs/multi30k"]
  assert "\n\nAverage BLEU 0.80: this model does not translate yet" in report.markdown(low)


@pytest.mark.parametrize("baseline", [False, True])
def test_plot_writes_a_png(tmp_path, baseline):
  path = tmp_path / "bleu.png"
  report.plot(scores(baseline=baseline), path)
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_language_is_one_language():
  assert report.summary(scores(num_languages=1)).splitlines()[0].endswith("over 1 language")
  assert "Average over 1 language:" in report.markdown(scores(num_languages=1))


def test_every_language_label_can_be_read_with_112_languages():
  """112 languages (the paper's count): each has a label of at least 8 points, and no two labels overlap."""
  fig = report.figure(scores(num_languages=112))
  fig.canvas.draw()
  ax = fig.axes[0]
  labels = [t for t in ax.get_yticklabels() if t.get_text()]
  assert sorted(t.get_text() for t in labels) == sorted(f"l{i:02d} ({10 + i})" for i in range(112))
  assert min(t.get_fontsize() for t in labels) >= 8
  boxes = sorted((t.get_window_extent() for t in labels), key=lambda b: b.y0)
  assert all(low.y1 <= high.y0 for low, high in zip(boxes, boxes[1:]))  # stacked, none over its neighbour
  assert [t.get_text() for t in labels][:2] == ["l111 (121)", "l110 (120)"]  # the best first, at the top

"""The readable forms of the scores: the Markdown report, the console summary and the plot."""

import pytest

from gshard_mt.evaluation import report


def scores(num_languages=3, baseline=False):
  languages = {f"l{i:02d}": {"train_pairs": 100 * i, "resource": "low" if i < 2 else "high", "sentences": 10,
                             "bleu": 10.0 + i, "chrf": 30.0 + i} for i in range(num_languages)}
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
  assert table(md, "| language") == [["l02", "200", "high", "10", "12.00", "32.00"],  # best BLEU first
                                     ["l01", "100", "low", "10", "11.00", "31.00"],
                                     ["l00", "0", "low", "10", "10.00", "30.00"]]
  assert table(md, "| resource") == [["high", "12.00", "32.00"], ["low", "10.50", "30.50"]]
  assert "`nrefs:1|bleu-sig`" in md and "ΔBLEU" not in md


def test_markdown_with_a_baseline_has_delta_columns():
  md = report.markdown(scores(baseline=True))
  assert "ΔBLEU +1.50 against runs/dense" in md
  assert table(md, "| language")[0] == ["l02", "200", "high", "10", "12.00", "32.00", "-0.25"]
  assert table(md, "| resource")[1] == ["low", "10.50", "30.50", "-0.25"]


def test_summary_shows_the_best_and_worst_languages():
  lines = report.summary(scores(num_languages=12), show=2).splitlines()
  assert lines[0] == "test step 6: average BLEU 11.00, chrF++ 31.00 over 12 languages"
  assert [line.split()[0] for line in lines[2:-1]] == ["l11", "l10", "...", "l01", "l00"]
  assert lines[-1] == "decoding: 12.3 sentences/s, 457 tokens/s"
  assert len(report.summary(scores(num_languages=4), show=2).splitlines()) == 2 + 4 + 1  # all shown: no "..."


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
  assert sorted(t.get_text() for t in labels) == sorted(f"l{i:02d}" for i in range(112))
  assert min(t.get_fontsize() for t in labels) >= 8
  boxes = sorted((t.get_window_extent() for t in labels), key=lambda b: b.y0)
  assert all(low.y1 <= high.y0 for low, high in zip(boxes, boxes[1:]))  # stacked, none over its neighbour
  assert [t.get_text() for t in labels][:2] == ["l111", "l110"]  # the best first, at the top

"""Readable forms of evaluation scores: a Markdown report, a console summary and a BLEU-per-language plot. Each
language's BLEU comes with its number of sentences and its 95% interval (`scoring.bleu_interval`); a language whose
interval holds the average over languages is marked (≈): its test set cannot tell its score from the average."""

from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from gshard_mt import figures, hints, io
from gshard_mt.errors import counted
from gshard_mt.training import scoring

COLOURS = {"high": "#1f77b4", "medium": "#ff7f0e", "low": "#2ca02c"}
LIKE_AVERAGE_ALPHA = 0.35  # the bars of the languages marked ≈, paler
TRANSLATES_FROM = 5.0  # an average BLEU below this is a model that does not translate yet (configs/tiny.py: 0.8)
LEARNING_CHECK = {"--config": "configs/multi30k.py", "--workdir": "runs/multi30k"}  # a config that translates


def _fmt(x, spec=".1f", signed=False):
  return "-" if x is None else format(x, ("+" if signed else "") + spec)


def like_average(s: dict, average: float) -> bool:
  """Whether a language's 95% BLEU interval holds the average over languages (marked ≈)."""
  low, high = s["bleu_interval"]
  return low <= average <= high


def interval(s: dict) -> str:
  return f"{s['bleu_interval'][0]:.2f}-{s['bleu_interval'][1]:.2f}"


def marked(scores: dict) -> str:
  """'50 of 112 languages': those marked ≈."""
  avg, languages = scores["average"]["bleu"], scores["languages"].values()
  return f"{sum(like_average(s, avg) for s in languages)} of {counted(len(languages), 'language')}"


def intervals_note(scores: dict) -> str:
  """What the intervals are and what ≈ says, with the number of languages marked."""
  avg = scores["average"]["bleu"]
  return (f"95% interval: the 2.5th to 97.5th percentile of the language's corpus BLEU over "
          f"{scoring.INTERVAL_SAMPLES:,} resamples of its test sentences (with replacement, seed "
          f"{scoring.INTERVAL_SEED}); the fewer sentences, the wider. ≈: the interval holds the average BLEU "
          f"({avg:.2f}), so this test set cannot tell the language's score from the average "
          f"({marked(scores)}). Two languages whose intervals do not overlap differ beyond doubt; where they "
          "overlap, this test set may not tell them apart.")


def not_translating(bleu: float, what: str) -> str | None:
  """A line saying that a model whose BLEU (`what`: which one) is under TRANSLATES_FROM does not translate yet,
  and what to train for translations; None above it."""
  if bleu >= TRANSLATES_FROM:
    return None
  train = hints.command(LEARNING_CHECK, program="train.py")
  return (f"{what} {bleu:.2f}: this model does not translate yet (the default run, configs/tiny.py, is a smoke test: "
          f"it learns, but it does not translate). For translations train configs/multi30k.py: {train} (test BLEU "
          f"about 30 after 29 minutes of steps on 2 CPU cores; its docstring has the numbers)")


def markdown(scores: dict) -> str:
  d, avg = scores["decoding"], scores["average"]
  has_delta = "baseline" in scores
  delta = lambda s: f" {_fmt(s.get('delta_bleu'), '.2f', True)} |" if has_delta else ""  # noqa: E731 - a column
  lines = [f"# {scores['split']} split, step {scores['step']} ({scores['workdir']})", "",
           f"Average over {counted(len(scores['languages']), 'language')}: BLEU {avg['bleu']:.2f}, "
           f"chrF++ {avg['chrf']:.2f}"
           + (f", ΔBLEU {_fmt(avg.get('delta_bleu'), '.2f', True)} against {scores['baseline']}" if has_delta else ""),
           *(["", note] if (note := not_translating(avg["bleu"], "Average BLEU")) else []),
           "", f"Decoding: beam {d['beam_size']}, α {d['alpha']}, max length {d['max_decode_len']}, "
           f"{d['sentences_per_s']:.1f} sentences/s, {d['tokens_per_s']:.0f} tokens/s"
           + (f"; parameters averaged over steps {d['averaged_steps']}" if d.get("averaged_steps") else ""), "",
           "| resource | BLEU | chrF++ |" + (" ΔBLEU |" if has_delta else ""),
           "|---|---|---|" + ("---|" if has_delta else "")]
  for bucket, s in scores["by_resource"].items():
    lines.append(f"| {bucket} | {s['bleu']:.2f} | {s['chrf']:.2f} |" + delta(s))
  lines += ["", intervals_note(scores), "",
            "| language | train pairs | resource | sentences | BLEU | 95% interval | ≈ | chrF++ |"
            + (" ΔBLEU |" if has_delta else ""), "|---|---|---|---|---|---|---|---|" + ("---|" if has_delta else "")]
  for lang, s in sorted(scores["languages"].items(), key=lambda kv: -kv[1]["bleu"]):
    lines.append(f"| {lang} | {s['train_pairs']} | {s['resource']} | {s['sentences']} | {s['bleu']:.2f} | "
                 f"{interval(s)} | {'≈' if like_average(s, avg['bleu']) else ''} | {s['chrf']:.2f} |" + delta(s))
  lines += ["", f"BLEU: `{scores['signatures']['bleu']}`", f"chrF++: `{scores['signatures']['chrf']}`", ""]
  return "\n".join(lines)


def summary(scores: dict, show: int = 5) -> str:
  """A few console lines: average, the best and worst languages with their sentences and intervals, and, for a
  model that does not translate yet, what to train for translations."""
  ranked = sorted(scores["languages"].items(), key=lambda kv: -kv[1]["bleu"])
  avg = scores["average"]
  out = [f"{scores['split']} step {scores['step']}: average BLEU {avg['bleu']:.2f}, chrF++ {avg['chrf']:.2f} over "
         + counted(len(ranked), "language")
         + (f", ΔBLEU {_fmt(avg.get('delta_bleu'), '.2f', True)}" if "baseline" in scores else ""),
         f"{'lang':6}{'BLEU':>7}  {'95% interval':13}{'chrF++':>7}{'sentences':>11}  resource"]
  shown = ranked if len(ranked) <= 2 * show else ranked[:show] + [("...", None)] + ranked[-show:]
  for lang, s in shown:
    mark = "≈" if s and like_average(s, avg["bleu"]) else " "
    out.append("..." if s is None else f"{lang:6}{s['bleu']:>7.2f}{mark} {interval(s):13}{s['chrf']:>7.2f}"
                                       f"{s['sentences']:>11}  {s['resource']}")
  d = scores["decoding"]
  out += [f"≈: {marked(scores)} hold the average BLEU in their 95% interval: this test set cannot tell their score "
          "from the average (report.md says more)",
          f"decoding: {d['sentences_per_s']:.1f} sentences/s, {d['tokens_per_s']:.0f} tokens/s"]
  if note := not_translating(avg["bleu"], "average BLEU"):
    out.append(note)
  return "\n".join(out)


ROW_INCHES, LABEL_POINTS = 0.17, 8  # bleu_by_language.png: the height of a language's bar, its label's size


def figure(scores: dict):
  """The figure of `plot`: one horizontal bar per language, best first, labelled with its code and its number of
  sentences at a readable size; BLEU bars carry their 95% interval, and those that hold the average (≈) are pale.
  The figure grows with the number of languages (112: about 21 inches, 2,500 pixels at 120 dpi)."""
  key = "delta_bleu" if "baseline" in scores else "bleu"
  avg = scores["average"]["bleu"]
  items = sorted(scores["languages"].items(), key=lambda kv: -(kv[1].get(key) or 0.0))
  fig, ax = figures.subplots(figsize=(7, max(3, ROW_INCHES * len(items) + 1.4)))
  rows = range(len(items))
  pale = [key == "bleu" and like_average(s, avg) for _, s in items]
  ax.barh(rows, [s.get(key) or 0.0 for _, s in items], height=0.75,
          color=[(COLOURS[s["resource"]], LIKE_AVERAGE_ALPHA if p else 1.0) for (_, s), p in zip(items, pale)])
  ax.set_yticks(rows, [f"{lang} ({s['sentences']})" for lang, s in items], fontsize=LABEL_POINTS)
  ax.set_ylim(len(items) - 0.5, -0.5)  # the best at the top
  ax.tick_params(axis="x", labeltop=True, top=True)  # a scale at both ends of a tall picture
  ax.grid(axis="x", alpha=0.3)
  ax.set_xlabel("ΔBLEU" if key == "delta_bleu" else "BLEU (black lines: the 95% interval)")
  handles = [Patch(color=c, label=f"{b} resource") for b, c in COLOURS.items()]
  if key == "delta_bleu":
    ax.axvline(0, color="black", linewidth=0.8)
  else:
    values = [s["bleu"] for _, s in items]
    ax.errorbar(values, rows, xerr=[[v - s["bleu_interval"][0] for v, (_, s) in zip(values, items)],
                                    [s["bleu_interval"][1] - v for v, (_, s) in zip(values, items)]],
                fmt="none", ecolor="black", elinewidth=0.8, capsize=1.5)
    ax.axvline(avg, color="black", linestyle="--", linewidth=0.8)
    handles += [Line2D([], [], color="black", linestyle="--", linewidth=0.8, label=f"average {avg:.2f}"),
                Patch(color="grey", alpha=LIKE_AVERAGE_ALPHA, label="pale: its interval holds the average")]
  ax.set_title(f"{scores['split']} split, step {scores['step']}: {'ΔBLEU' if key == 'delta_bleu' else 'BLEU'} "
               f"per language ({counted(len(items), 'language')}; in brackets its test sentences)", fontsize=9)
  ax.legend(handles=handles, fontsize=8, loc="lower right")
  fig.tight_layout()
  return fig


def plot(scores: dict, path: io.PathLike):
  """Bars of BLEU (ΔBLEU with a baseline) per language, sorted, coloured by resource size (`figure`), written as a
  PNG to `path` (any storage: rendered in memory, then written whole)."""
  figures.save(figure(scores), io.path(path), dpi=120)

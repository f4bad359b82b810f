"""Readable forms of evaluation scores: a Markdown report, a console summary and a BLEU-per-language plot."""

from __future__ import annotations

from matplotlib.patches import Patch

from gshard_mt import figures, io
from gshard_mt.errors import counted

COLOURS = {"high": "#1f77b4", "medium": "#ff7f0e", "low": "#2ca02c"}


def _fmt(x, spec=".1f", signed=False):
  return "-" if x is None else format(x, ("+" if signed else "") + spec)


def markdown(scores: dict) -> str:
  d, avg = scores["decoding"], scores["average"]
  has_delta = "baseline" in scores
  delta = lambda s: f" {_fmt(s.get('delta_bleu'), '.2f', True)} |" if has_delta else ""  # noqa: E731 - a column
  lines = [f"# {scores['split']} split, step {scores['step']} ({scores['workdir']})", "",
           f"Average over {counted(len(scores['languages']), 'language')}: BLEU {avg['bleu']:.2f}, "
           f"chrF++ {avg['chrf']:.2f}"
           + (f", ΔBLEU {_fmt(avg.get('delta_bleu'), '.2f', True)} against {scores['baseline']}" if has_delta else ""),
           "", f"Decoding: beam {d['beam_size']}, α {d['alpha']}, max length {d['max_decode_len']}, "
           f"{d['sentences_per_s']:.1f} sentences/s, {d['tokens_per_s']:.0f} tokens/s"
           + (f"; parameters averaged over steps {d['averaged_steps']}" if d.get("averaged_steps") else ""), "",
           "| resource | BLEU | chrF++ |" + (" ΔBLEU |" if has_delta else ""),
           "|---|---|---|" + ("---|" if has_delta else "")]
  for bucket, s in scores["by_resource"].items():
    lines.append(f"| {bucket} | {s['bleu']:.2f} | {s['chrf']:.2f} |" + delta(s))
  lines += ["", "| language | train pairs | resource | sentences | BLEU | chrF++ |" + (" ΔBLEU |" if has_delta else ""),
            "|---|---|---|---|---|---|" + ("---|" if has_delta else "")]
  for lang, s in sorted(scores["languages"].items(), key=lambda kv: -kv[1]["bleu"]):
    lines.append(f"| {lang} | {s['train_pairs']} | {s['resource']} | {s['sentences']} | {s['bleu']:.2f} | "
                 f"{s['chrf']:.2f} |" + delta(s))
  lines += ["", f"BLEU: `{scores['signatures']['bleu']}`", f"chrF++: `{scores['signatures']['chrf']}`", ""]
  return "\n".join(lines)


def summary(scores: dict, show: int = 5) -> str:
  """A few console lines: average, the best and worst languages."""
  ranked = sorted(scores["languages"].items(), key=lambda kv: -kv[1]["bleu"])
  avg = scores["average"]
  out = [f"{scores['split']} step {scores['step']}: average BLEU {avg['bleu']:.2f}, chrF++ {avg['chrf']:.2f} over "
         + counted(len(ranked), "language")
         + (f", ΔBLEU {_fmt(avg.get('delta_bleu'), '.2f', True)}" if "baseline" in scores else ""),
         f"{'lang':6}{'BLEU':>7}{'chrF++':>8}  resource"]
  shown = ranked if len(ranked) <= 2 * show else ranked[:show] + [("...", None)] + ranked[-show:]
  for lang, s in shown:
    out.append("..." if s is None else f"{lang:6}{s['bleu']:>7.2f}{s['chrf']:>8.2f}  {s['resource']}")
  d = scores["decoding"]
  out.append(f"decoding: {d['sentences_per_s']:.1f} sentences/s, {d['tokens_per_s']:.0f} tokens/s")
  return "\n".join(out)


ROW_INCHES, LABEL_POINTS = 0.17, 8  # bleu_by_language.png: the height of a language's bar, its label's size


def figure(scores: dict):
  """The figure of `plot`: one horizontal bar per language, best first, each labelled with its code at a readable
  size; the figure grows with the number of languages (112: about 21 inches, 2,500 pixels at 120 dpi)."""
  key = "delta_bleu" if "baseline" in scores else "bleu"
  items = sorted(((lang, s.get(key) or 0.0, s["resource"]) for lang, s in scores["languages"].items()),
                 key=lambda t: -t[1])
  fig, ax = figures.subplots(figsize=(7, max(3, ROW_INCHES * len(items) + 1.4)))
  rows = range(len(items))
  ax.barh(rows, [v for _, v, _ in items], height=0.75, color=[COLOURS[r] for _, _, r in items])
  ax.set_yticks(rows, [lang for lang, _, _ in items], fontsize=LABEL_POINTS)
  ax.set_ylim(len(items) - 0.5, -0.5)  # the best at the top
  ax.tick_params(axis="x", labeltop=True, top=True)  # a scale at both ends of a tall picture
  ax.grid(axis="x", alpha=0.3)
  ax.set_xlabel("ΔBLEU" if key == "delta_bleu" else "BLEU")
  if key == "delta_bleu":
    ax.axvline(0, color="black", linewidth=0.8)
  ax.set_title(f"{scores['split']} split, step {scores['step']}: {'ΔBLEU' if key == 'delta_bleu' else 'BLEU'} "
               f"per language ({counted(len(items), 'language')})")
  ax.legend(handles=[Patch(color=c, label=f"{b} resource") for b, c in COLOURS.items()], fontsize=8,
            loc="lower right")
  fig.tight_layout()
  return fig


def plot(scores: dict, path: io.PathLike):
  """Bars of BLEU (ΔBLEU with a baseline) per language, sorted, coloured by resource size (`figure`), written as a
  PNG to `path` (any storage: rendered in memory, then written whole)."""
  figures.save(figure(scores), io.path(path), dpi=120)

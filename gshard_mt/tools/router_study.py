"""The router study: trains every run of a sweep of routers (points x seeds, named '<point>_s<seed>'), decodes each
run's test split at its lowest-dev-loss checkpoint, and reports which router wins and by how much beyond the spread
between seeds.

  python -m gshard_mt.tools.router_study --sweep configs/sweeps/routers.py [--root runs/sweeps/routers]
      [--report_dir bench/results/routers] [--report_only] [--jobs N] [-- extra train.py arguments]

Writes into the report directory: report.md and report.json (per point: each seed's test BLEU per language and
best dev loss, their mean and spread, tokens/s, and per MoE layer the expert-load CV and the dropped fractions over
the last quarter of training; the verdict), dev_loss.png (each run's dev-loss curve) and bleu.png (each seed's
average test BLEU by point). Finished runs are not trained or decoded again; --report_only reports those.
"""

from __future__ import annotations

import numpy as np
from etils import epath
from matplotlib import colormaps

from gshard_mt import cli, figures, io
from gshard_mt.data.corpus import language_of
from gshard_mt.tools import study
from gshard_mt.tools import sweep as sweep_lib

DENSE = "dense"  # the dense twin's point
DEFAULT = "gshard"  # today's router, the one to beat


def point_of(run_name: str) -> str:
  """'switch_s1' -> 'switch'."""
  return run_name.rsplit("_s", 1)[0]


def summarize_run(workdir: epath.Path, run: dict) -> dict:
  """study.summarize's run summary, with its dev-loss curve and test BLEU keyed by language."""
  out = study.summarize(workdir, run)
  rows = io.read_jsonl(workdir / "metrics.jsonl")
  out["curve"] = [(r["step"], r["dev_loss"]) for r in rows if "dev_loss" in r]
  out["bleu"] = {language_of(stream): s["bleu"] for stream, s in out["test"].items()}
  return out


def spread(values: list[float]) -> dict:
  return {"mean": float(np.mean(values)), "spread": float(np.max(values) - np.min(values)),
          "seeds": [float(v) for v in values]}


def aggregate(runs: list[dict]) -> list[dict]:
  """Per point, in the sweep's order: its runs' average test BLEU and BLEU per language (None until every seed is
  decoded), best dev loss (mean, spread = max - min over seeds, each seed's value), tokens/s, and per MoE layer the
  routing statistics averaged over seeds."""
  points = {}
  for r in runs:
    points.setdefault(point_of(r["name"]), []).append(r)
  out = []
  for name, rs in points.items():
    # BLEU only once every seed is decoded: one seed's alone would have a spread of 0
    decoded = rs if all(r["average_bleu"] is not None for r in rs) else []
    languages = sorted(decoded[0]["bleu"]) if decoded else []
    layers = sorted(rs[0]["routing"])
    out.append({
        "point": name, "runs": [r["name"] for r in rs], "experts": rs[0]["experts"],
        "dev_loss": spread([r["dev_loss"] for r in rs]),
        "bleu": spread([r["average_bleu"] for r in decoded]) if decoded else None,
        "bleu_by_language": {lang: spread([r["bleu"][lang] for r in decoded]) for lang in languages},
        "tokens_per_s": float(np.mean([r["tokens_per_s"] for r in rs if r["tokens_per_s"]] or [np.nan])),
        "routing": {layer: {k: float(np.mean([r["routing"][layer][k] for r in rs])) for k in study.ROUTING_KEYS}
                    for layer in layers}})
  return out


def compare(a: dict, b: dict, key: str, sign: float) -> dict:
  """a against b on `key` ('bleu', higher is better: sign 1; 'dev_loss', lower: sign -1): the lead of a's mean,
  the larger of the two seed spreads, and whether the lead is beyond it."""
  lead = sign * (a[key]["mean"] - b[key]["mean"])
  noise = max(a[key]["spread"], b[key]["spread"])
  return {"lead": lead, "noise": noise, "beyond_noise": lead > noise}


def verdict(points: list[dict]) -> dict:
  """Which point has the best mean test BLEU (and dev loss), and its lead over the dense twin, over gshard and over
  the runner-up, each against the seed spread."""
  out = {}
  for key, sign in (("bleu", 1.0), ("dev_loss", -1.0)):
    ranked = sorted((p for p in points if p[key]), key=lambda p: -sign * p[key]["mean"])
    if len(ranked) < 2:
      continue
    best, labels = ranked[0], {ranked[1]["point"]: ["runner-up"]}
    for p in points:
      if p["point"] in (DENSE, DEFAULT) and p is not best and p[key]:
        labels.setdefault(p["point"], []).append({DENSE: "dense twin", DEFAULT: "today's default"}[p["point"]])
    by_name = {p["point"]: p for p in points}
    out[key] = {"best": best["point"], "against": {
        ", ".join(label): {"point": name, **compare(best, by_name[name], key, sign)} for name, label in labels.items()}}
  return out


def verdict_lines(v: dict) -> list[str]:
  lines = []
  for key, what, unit in (("bleu", "average test BLEU", "BLEU"), ("dev_loss", "best dev loss", "nats")):
    if key not in v:
      continue
    parts = [f"{c['point']} ({label}) by {c['lead']:+.3g} {unit} "
             f"({'beyond' if c['beyond_noise'] else 'within'} the seed spread of {c['noise']:.3g})"
             for label, c in v[key]["against"].items()]
    lines.append(f"- **{what}**: {v[key]['best']} is best, ahead of " + "; ".join(parts) + ".")
  return lines


def markdown(points: list[dict], v: dict) -> str:
  f = lambda s, d=2: "-" if not s else f"{s['mean']:.{d}f} ± {s['spread'] / 2:.{d}f}"  # noqa: E731
  seeds = lambda s, d=1: "-" if not s else " / ".join(f"{x:.{d}f}" for x in s["seeds"])  # noqa: E731
  languages = sorted({lang for p in points for lang in p["bleu_by_language"]})
  lines = ["# Routers: which one wins", "", "## Verdict", "", *verdict_lines(v), "",
           "## Test BLEU and dev loss (mean ± half the spread between seeds; each seed's value)", "",
           "| point | avg test BLEU | seeds | " + " | ".join(languages) + " | best dev loss | seeds | tokens/s |",
           "|---|---|---|" + "---|" * len(languages) + "---|---|---|"]
  for p in points:
    per_language = " | ".join(f(p["bleu_by_language"].get(lang), 1) for lang in languages)
    lines.append(f"| {p['point']} | {f(p['bleu'])} | {seeds(p['bleu'])} | {per_language} | "
                 f"{f(p['dev_loss'], 3)} | {seeds(p['dev_loss'], 3)} | {p['tokens_per_s']:.0f} |")
  lines += study.routing_table("## Routing per MoE layer (last quarter of training, mean over seeds)", "point",
                               {p["point"]: p["routing"] for p in points},
                               ("first choices dropped", "later choices dropped"))
  lines += ["", "For expert_choice, 'first choices dropped' is the fraction of tokens no expert took. BLEU: "
            "sacrebleu, beam 4, alpha 0.6, each run's lowest-dev-loss checkpoint on test_2016_flickr.", ""]
  return "\n".join(lines)


def plot(runs: list[dict], points: list[dict], out: epath.Path) -> list[epath.Path]:
  names = [p["point"] for p in points]
  colours = {n: colormaps["tab10"](i % 10) for i, n in enumerate(names)}
  fig, ax = figures.subplots(figsize=(9, 5))
  for r in runs:
    steps, losses = zip(*r["curve"]) if r["curve"] else ((), ())
    first = r["name"] == next(x["name"] for x in runs if point_of(x["name"]) == point_of(r["name"]))
    ax.plot(steps, losses, color=colours[point_of(r["name"])], lw=1.2, label=point_of(r["name"]) if first else None)
  ax.set(xlabel="step", ylabel="dev loss (nats per token)", title="dev loss, every run (one colour per point)")
  ax.set_ylim(top=min(ax.get_ylim()[1], 4.5))
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, ncol=2)
  paths = [figures.save(fig, out / "dev_loss.png", dpi=110)]
  fig, ax = figures.subplots(figsize=(9, 4))
  for i, p in enumerate(points):
    if p["bleu"]:
      ax.plot([i] * len(p["bleu"]["seeds"]), p["bleu"]["seeds"], "o", color=colours[p["point"]])
      ax.hlines(p["bleu"]["mean"], i - 0.3, i + 0.3, color="black")
  ax.set_xticks(range(len(names)), names, rotation=30)
  ax.set(ylabel="average test BLEU", title="test BLEU: each seed (dots) and their mean (bar)")
  ax.grid(axis="y", alpha=0.3)
  fig.tight_layout()
  return paths + [figures.save(fig, out / "bleu.png", dpi=110)]


def main(argv):
  parser = sweep_lib.parser(__doc__)
  parser.add_argument("--report_only", action="store_true", help="report the runs already finished")
  parser.add_argument("--report_dir", default=None, help="default: bench/results/<sweep file name>")
  args, base, runs, root, extra = sweep_lib.parse(parser, argv)
  out = epath.Path(args.report_dir or sweep_lib.ROOT / "bench" / "results" / epath.Path(args.sweep).stem)
  io.check_writable(out, "report directory")  # before any run
  done = study.run_and_collect(args, base, runs, root, extra, summarize_run)
  points = aggregate(done)
  v = verdict(points)
  study.write_report(out, {"points": points, "verdict": v, "runs": done}, markdown(points, v), plot(done, points, out))


if __name__ == "__main__":
  cli.run(main)

"""The MoE-versus-dense study: trains every point of a sweep file, decodes each point's test split with the
checkpoint of its lowest dev loss, and reports what experts buy, as the paper's Figure 6 and Table 3 do.

  python -m gshard_mt.tools.study --sweep configs/sweeps/study.py [--root runs/sweeps/study] [--report_only]
                                  [--jobs N] [-- extra train.py arguments applied to every point]

Points whose `data.languages` names one language are bilingual baselines; the others are multilingual models
(dense when `model.moe_interval` is 0). Writes into the root: report.md and report.json (ΔBLEU and ΔchrF++ of
each multilingual model against the bilingual baselines per language, sorted by training data size; average BLEU,
chrF++, dev loss and tokens/s of each model; per MoE layer, expert-load balance and dropped fractions),
delta_bleu.png and experts.png. Finished points are not trained or decoded again; with
--report_only, points whose training has not finished are left out. --jobs N trains and decodes N points at once
(as the sweep command does).
"""

from __future__ import annotations

import json

import numpy as np
from etils import epath

from gshard_mt import cli, figures, io
from gshard_mt.data.corpus import language_of
from gshard_mt.errors import WorkdirError
from gshard_mt.io import write_atomically
from gshard_mt.tools import sweep as sweep_lib
from gshard_mt.training import checkpoint as checkpoint_lib
from gshard_mt.training import validate

ROUTING_KEYS = ("load_cv", "load_min", "load_max", "top1_dropped", "top2_dropped")


def best_step(workdir: epath.Path) -> int:
  """The checkpointed step with the lowest dev loss (early stopping, the same rule for every point)."""
  saved = {int(p.name) for p in (workdir / checkpoint_lib.FOLDER).iterdir() if p.name.isdigit()}
  dev = [(r["dev_loss"], r["step"]) for r in io.read_jsonl(workdir / "metrics.jsonl") if "dev_loss" in r]
  scored = [d for d in dev if d[1] in saved]
  if not scored:
    raise WorkdirError(f"{workdir}: no checkpoint with a dev loss (set eval_every to a multiple of checkpoint_every)")
  return min(scored)[1]


def test_scores(workdir: epath.Path, step: int) -> dict | None:
  path = workdir / "eval" / f"test-{step}" / "scores.json"
  return json.loads(path.read_text()) if path.exists() else None


def routing(rows: list[dict], tail: float = 0.25) -> dict[str, dict[str, float]]:
  """Per MoE layer ('encoder_0', ...): each routing statistic averaged over the last `tail` of the logged steps."""
  logged = [r for r in rows if any(k.endswith("/load_cv") for k in r)]
  last = logged[int(len(logged) * (1 - tail)):]
  layers = sorted({k.split("/")[1] for r in last for k in r if k.startswith("moe/") and k.endswith("/load_cv")})
  return {layer: {key: float(np.mean([r[f"moe/{layer}/{key}"] for r in last])) for key in ROUTING_KEYS}
          for layer in layers}


def summarize(workdir: epath.Path, point: dict) -> dict:
  """One point: its kind, experts, best step, dev loss, tokens/s, routing and per-stream test scores."""
  config = validate.load_saved(workdir)
  rows = io.read_jsonl(workdir / "metrics.jsonl")
  step = best_step(workdir)
  scores = test_scores(workdir, step)
  speeds = [r["tokens_per_s"] for r in rows if r.get("tokens_per_s")][1:]  # the first log includes compilation
  experts = config.moe.num_experts if config.model.moe_interval else 0
  languages = [lang.strip() for lang in config.data.languages.split(",") if lang.strip()]
  return {"name": point["name"], "bilingual": len(languages) == 1, "source": config.data.source,
          "languages": config.data.languages, "experts": experts, "moe_interval": config.model.moe_interval,
          "best_step": step,
          "dev_loss": min(r["dev_loss"] for r in rows if r["step"] == step and "dev_loss" in r),
          "tokens_per_s": float(np.median(speeds)) if speeds else None, "routing": routing(rows),
          "test": scores["languages"] if scores else {}, "average_bleu": scores["average"]["bleu"] if scores else None,
          "average_chrf": scores["average"]["chrf"] if scores else None,
          "signature": scores["signatures"]["bleu"] if scores else None}


def baseline_stream(bilingual: dict, streams) -> str | None:
  """The multilingual stream a bilingual baseline stands for: its language, from its source when joined sources
  share the language ('deu' from multi30k -> 'deu.multi30k')."""
  lang = bilingual["languages"]
  matches = [s for s in streams if language_of(s) == lang and (s == lang or s.endswith("." + bilingual["source"]))]
  return matches[0] if len(matches) == 1 else None


def compare(points: list[dict]) -> list[dict]:
  """Per baselined stream that every multilingual model was tested on, sorted by training pairs (most first): the
  bilingual BLEU and chrF++, each multilingual model's BLEU and chrF++ and their differences from the bilingual's."""
  multi = [p for p in points if not p["bilingual"] and p["test"]]
  streams = {s: v for s, v in (multi[0]["test"] if multi else {}).items() if all(s in m["test"] for m in multi)}
  out = []
  for b in (p for p in points if p["bilingual"] and p["test"]):
    stream = baseline_stream(b, streams)
    if stream is None:
      continue
    base = next(iter(b["test"].values()))
    row = {"stream": stream, "train_pairs": streams[stream]["train_pairs"], "sentences": streams[stream]["sentences"],
           "bilingual": base["bleu"], "bilingual_chrf": base["chrf"]}
    for m in multi:
      row[m["name"]] = m["test"][stream]["bleu"]
      row[f"delta_{m['name']}"] = m["test"][stream]["bleu"] - base["bleu"]
      row[f"delta_chrf_{m['name']}"] = m["test"][stream]["chrf"] - base["chrf"]
    out.append(row)
  return sorted(out, key=lambda r: -r["train_pairs"])


def moe_layers(point: dict) -> str:
  """Which FFNs are MoE layers: '-' (dense), 'all' or '1 in N'."""
  return {0: "-", 1: "all"}.get(point["moe_interval"], f"1 in {point['moe_interval']}")


def markdown(points: list[dict], table: list[dict]) -> str:
  f = lambda v, d=1: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
  multi = [p for p in points if not p["bilingual"]]
  lines = ["# MoE versus dense", "", "## Multilingual models", "",
           "| model | experts | MoE layers | best step | dev loss | avg test BLEU | avg test chrF++ | tokens/s |",
           "|---|---|---|---|---|---|---|---|"]
  lines += [f"| {p['name']} | {p['experts'] or 'dense'} | {moe_layers(p)} | {p['best_step']} | "
            f"{f(p['dev_loss'], 3)} | {f(p['average_bleu'])} | {f(p['average_chrf'])} | {f(p['tokens_per_s'], 0)} |"
            for p in multi]
  names = [p["name"] for p in multi if p["test"]]
  lines += ["", "## ΔBLEU against bilingual baselines (test BLEU; sorted by training pairs)", "",
            "| stream | train pairs | test sentences | bilingual | " + " | ".join(f"{n} (Δ)" for n in names) + " |",
            "|---|---|---|---|" + "---|" * len(names)]
  for r in table:
    cells = [f"{f(r[n])} ({r[f'delta_{n}']:+.1f})" for n in names]
    lines.append(f"| {r['stream']} | {r['train_pairs']:,} | {r['sentences']} | {f(r['bilingual'])} | "
                 + " | ".join(cells) + " |")
  if table:
    means = [f"{np.mean([r[f'delta_{n}'] for r in table]):+.2f}" for n in names]
    lines.append("| mean Δ | | | | " + " | ".join(means) + " |")
    lines += ["", "ΔchrF++ against the same baselines: " + "; ".join(
        f"{r['stream']} " + ", ".join(f"{n} {r[f'delta_chrf_{n}']:+.1f}" for n in names) for r in table) + "."]
  lines += routing_table("## Routing per MoE layer (mean over the last quarter of training)", "model",
                         {p["name"]: p["routing"] for p in multi}, ("top-1 dropped", "top-2 dropped"))
  signature = next((p["signature"] for p in points if p["signature"]), None)
  lines += ["", f"BLEU: sacrebleu {signature}, beam 4, alpha 0.6, each point's lowest-dev-loss checkpoint.", ""]
  return "\n".join(lines)


def plot(points: list[dict], table: list[dict], root: epath.Path) -> list[epath.Path]:
  multi = [p for p in points if not p["bilingual"]]
  paths = []
  if table:
    fig, axes = figures.subplots(2, 1, figsize=(max(6, 1.6 * len(table)), 7), sharex=True)
    width = 0.8 / len(multi)
    for ax, key, metric in zip(axes, ("delta_", "delta_chrf_"), ("BLEU", "chrF++")):
      for i, p in enumerate(multi):
        ax.bar(np.arange(len(table)) + (i - (len(multi) - 1) / 2) * width,
               [r.get(key + p["name"], np.nan) for r in table], width, label=p["name"])
      ax.axhline(0, color="black", lw=0.8)
      ax.set(ylabel=f"Δ{metric} vs bilingual (test)")
      ax.grid(axis="y", alpha=0.3)
    axes[0].set_title("multilingual minus bilingual, by training data (most first)")
    axes[0].legend(fontsize=8)
    axes[1].set_xticks(range(len(table)), [f"{r['stream']}\n{r['train_pairs']:,} pairs" for r in table], fontsize=8)
    fig.tight_layout()
    paths.append(figures.save(fig, root / "delta_bleu.png", dpi=110))
  panels = (("average_bleu", "average test BLEU, all streams"), ("average_chrf", "average test chrF++"),
            ("dev_loss", "best dev loss (NLL)"), ("tokens_per_s", "training tokens/s"))
  fig, axes = figures.subplots(1, len(panels), figsize=(18, 3.8))
  x = [p["name"] for p in multi]  # the sweep's order: dense, then more and more experts, then other conditions
  for ax, (key, title) in zip(axes, panels):
    ax.plot(x, [np.nan if p[key] is None else p[key] for p in multi], marker="o", ls="none")  # points, no trend
    ax.set(xlabel="model (equal FLOPs per token)", title=title)
    ax.tick_params(axis="x", labelrotation=30)
    ax.grid(alpha=0.3)
  fig.tight_layout()
  paths.append(figures.save(fig, root / "experts.png", dpi=110))
  return paths


def trained(workdir: epath.Path, base: str, point: dict, extra: list[str]) -> bool:
  """Whether the point's run has the checkpoint of its last step, as this command would run it (a
  `-- --config.num_train_steps=N` given later trains further)."""
  return (workdir / checkpoint_lib.FOLDER / str(sweep_lib.planned(base, point, extra).num_train_steps)).exists()


def run_point(base: str, workdir: epath.Path, point: dict, extra: list[str], log: epath.Path | None = None):
  """Trains the point (resuming where it stopped), keeping every checkpoint whatever --config.num_train_steps
  (early stopping may pick any), and decodes its best checkpoint's test split once."""
  if not trained(workdir, base, point, extra):
    planned = sweep_lib.planned(base, point, extra)
    saves = -(-planned.num_train_steps // planned.checkpoint_every)  # every checkpoint_every steps, and the last
    keep = [f"--config.keep_checkpoints={saves}"] if planned.keep_checkpoints < saves else []
    sweep_lib.run(sweep_lib.command(base, workdir, point, extra + keep), point["name"], log)
  step = best_step(workdir)
  if test_scores(workdir, step) is None:
    sweep_lib.run(sweep_lib.eval_command(workdir, "--step", str(step)), point["name"], log)


def run_and_collect(args, base, points: list[dict], root, extra: list[str], summarize) -> list[dict]:
  """Trains and scores the points not finished yet (none with --report_only); `summarize(workdir, point)` of each
  finished point."""
  if not args.report_only:
    sweep_lib.run_points(points, lambda point, log: run_point(base, root / point["name"], point, extra, log), root,
                         args.jobs)
  done = [summarize(root / p["name"], p) for p in points if trained(root / p["name"], base, p, extra)]
  if not done:
    raise WorkdirError(f"{root}: no finished point to report")
  return done


def main(argv):
  parser = sweep_lib.parser(__doc__)
  parser.add_argument("--report_only", action="store_true", help="report the points already finished")
  args, base, points, root, extra = sweep_lib.parse(parser, argv)
  done = run_and_collect(args, base, points, root, extra, summarize)
  table = compare(done)
  write_report(root, {"points": done, "comparison": table}, markdown(done, table), plot(done, table, root))


def routing_table(title: str, what: str, routing: dict[str, dict], dropped: tuple[str, str]) -> list[str]:
  """Markdown lines: a title, then a row per (run or point, MoE layer) of its load spread and dropped fractions."""
  lines = ["", title, "", f"| {what} | layer | load CV | load min | load max | {dropped[0]} | {dropped[1]} |",
           "|---|---|---|---|---|---|---|"]
  for name, layers in routing.items():
    for layer, s in layers.items():
      lines.append(f"| {name} | {layer} | {s['load_cv']:.3f} | {s['load_min']:.3f} | {s['load_max']:.3f} | "
                   f"{s['top1_dropped']:.4f} | {s['top2_dropped']:.4f} |")
  return lines


def write_report(out: epath.Path, report: dict, text: str, pictures: list[epath.Path]):
  """report.json and report.md (`text`, printed too) in `out`, beside the `pictures` already drawn."""
  write_atomically(out / "report.json", json.dumps(report, indent=2))
  write_atomically(out / "report.md", text)
  print(text)
  print(f"wrote {out}/report.md, report.json, " + ", ".join(p.name for p in pictures))


if __name__ == "__main__":
  cli.run(main)

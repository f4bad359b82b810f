"""Which experts each language uses, layer by layer, in a trained MoE work directory.

  python -m gshard_mt.tools.expert_usage --workdir runs/x [--split dev] [--step N] [--max_pairs 2000]

Teacher-forced passes over each language's pairs of the split (those that fit the training rows; at most
--max_pairs per language), one language per batch, with the evaluation capacity and no noise, count per MoE layer
(encoder and decoder apart) each language's token assignments to each expert, asked for and kept by capacity
(`gshard_mt.evaluation.expert_usage`). Writes <workdir>/expert_usage/<split>-<step>/:
  expert_usage.json  the counts, and per layer the statistics below;
  report.md          per layer the normalised mutual information (NMI) between language and expert (0: every
                     language spreads over the experts alike; 1: the expert tells the language, or the language the
                     expert), and per language its entropy over the experts (bits) and the experts carrying 90% of
                     its assignments;
  heatmaps.png       a heatmap per layer: languages x experts, each language's share of its assignments, languages
                     in the order of an average-linkage clustering of their use over all layers, one colour scale;
  similarity.png     that clustering's dendrogram and the ordered Jensen-Shannon distances between the languages.
The statistics are over the assignments asked for (the router's choice, before capacity drops any).
"""

from __future__ import annotations

import json

import numpy as np
from scipy.cluster import hierarchy
from scipy.spatial.distance import squareform

from gshard_mt import cli, figures, io
from gshard_mt.errors import WorkdirError
from gshard_mt.evaluation import evaluate
from gshard_mt.evaluation import expert_usage as usage
from gshard_mt.training import validate

SHARE = 0.9  # the share of a language's assignments that report.md counts the experts of
SPLITS = ("train", "dev", "test")


def statistics(layers: dict[str, dict[str, np.ndarray]]) -> dict:
  """{layer: {language: int [2, E]}} -> {layer: {'nmi', 'entropy_bits': {language}, 'experts_for_90':
  {language}}}, from the assignments asked for (row 0)."""
  out = {}
  for layer, by_lang in layers.items():
    asked = np.stack([c[0] for c in by_lang.values()])
    out[layer] = {"nmi": usage.normalized_mutual_information(asked),
                  "entropy_bits": dict(zip(by_lang, usage.entropy(usage.shares(asked)).round(4).tolist())),
                  "experts_for_90": dict(zip(by_lang, usage.experts_for_share(asked, SHARE).tolist()))}
  return out


def cluster_order(layers: dict[str, dict[str, np.ndarray]], languages: list[str]) -> tuple[list[int], np.ndarray,
                                                                                              np.ndarray | None]:
  """(the languages' order, their Jensen-Shannon distances [N, N] over all layers' shares of the asked
  assignments, the average-linkage tree or None for fewer than three languages)."""
  p = np.concatenate([usage.shares(np.stack([layers[layer][lang][0] for lang in languages])) for layer in layers], 1)
  distances = usage.js_distances(p)
  if len(languages) < 3:
    return list(range(len(languages))), distances, None
  tree = hierarchy.optimal_leaf_ordering(hierarchy.linkage(squareform(distances, checks=False), "average"),
                                         squareform(distances, checks=False))
  return hierarchy.leaves_list(tree).tolist(), distances, tree


def label_size(n: int) -> float:
  return 9.0 if n <= 40 else 6.0


def plot_heatmaps(layers: dict, languages: list[str], order: list[int], path):
  """One panel per layer (languages in `order` x experts), one colour scale for all: the language's share."""
  n, E = len(languages), len(next(iter(next(iter(layers.values())).values()))[0])
  mats = {layer: usage.shares(np.stack([layers[layer][languages[i]][0] for i in order])) for layer in layers}
  vmax = max(float(m.max()) for m in mats.values()) or 1.0
  panel = max(1.3, 0.22 * E)
  fig, axes = figures.subplots(1, len(mats), figsize=(1.6 + panel * len(mats) + 1.0, 1.8 + 0.12 * max(n, 12)),
                               sharey=True, squeeze=False, layout="constrained")
  for ax, (layer, m) in zip(axes[0], mats.items()):
    image = ax.imshow(m, aspect="auto", cmap="viridis", vmin=0.0, vmax=vmax, interpolation="nearest")
    ax.set_title(layer.replace("_", " "), fontsize=9)
    ax.set_xticks(range(E), range(E), fontsize=label_size(E))
    ax.set_xlabel("expert", fontsize=9)
  axes[0][0].set_yticks(range(n), [languages[i] for i in order], fontsize=label_size(n))
  fig.colorbar(image, ax=axes[0].tolist(), shrink=min(1.0, 30 / max(n, 1) + 0.3), label="share of the language's "
               "assignments (asked)")
  fig.suptitle("Expert use by language (languages ordered by clustering)", fontsize=10)
  figures.save(fig, path, dpi=110)


def plot_similarity(distances: np.ndarray, tree, languages: list[str], order: list[int], path):
  """The dendrogram (where there is a tree) beside the distance matrix, both in `order`."""
  n = len(languages)
  size = 3.0 + 0.12 * max(n, 12)
  fig, axes = figures.subplots(1, 2, figsize=(size * 1.45, size), width_ratios=(1, 2.2), layout="constrained")
  names = [languages[i] for i in order]
  if tree is not None and distances.max() > 0:  # all alike: no tree to draw
    hierarchy.dendrogram(tree, orientation="left", labels=languages, ax=axes[0], leaf_font_size=label_size(n),
                         color_threshold=0, above_threshold_color="0.3")
    axes[0].set_ylim(10 * n, 0)  # leaf i at 10 i + 5: top to bottom as the matrix's rows
    axes[0].set_xlabel("Jensen-Shannon distance", fontsize=8)
  else:
    axes[0].axis("off")
  image = axes[1].imshow(distances[np.ix_(order, order)], cmap="magma_r", vmin=0.0, interpolation="nearest",
                         aspect="auto")  # as tall as the dendrogram, row by row beside its leaves
  axes[1].yaxis.tick_right()
  axes[1].set_xticks(range(n), names, rotation=90, fontsize=label_size(n))
  axes[1].set_yticks(range(n), names, fontsize=label_size(n))
  fig.colorbar(image, ax=axes[1], shrink=0.6, pad=0.06,
               label="Jensen-Shannon distance of expert use (mean over layers)")
  fig.suptitle("Languages by their expert use", fontsize=10)
  figures.save(fig, path, dpi=110)


def report(result: dict) -> str:
  """report.md: per layer the NMI, then per language its entropy and experts for 90%, layer by layer."""
  layers, E = list(result["layers"]), result["num_experts"]
  lines = [f"# Expert use by language: {result['workdir']}, step {result['step']}, {result['split']} split", "",
           f"{len(result['languages'])} languages, {E} experts per MoE layer, router {result['router']}; "
           f"over the assignments asked for. NMI: I(language; expert) / min(H(language), H(expert)), each language "
           f"weighted equally. Entropy in bits (at most {np.log2(E):.2f}); n90: the experts carrying 90% of the "
           "language's assignments. Pictures: heatmaps.png, similarity.png.", "",
           "| layer | NMI | mean entropy | mean n90 | kept |", "| --- | --- | --- | --- | --- |"]
  for layer in layers:
    s, c = result["layers"][layer], result["counts"][layer]
    kept = sum(sum(v[1]) for v in c.values()) / max(sum(sum(v[0]) for v in c.values()), 1)
    lines.append(f"| {layer} | {s['nmi']:.3f} | {np.mean(list(s['entropy_bits'].values())):.2f} | "
                 f"{np.mean(list(s['experts_for_90'].values())):.2f} | {kept:.1%} |")
  lines += ["", "Per language (clustered order): entropy / n90 in each layer.", "",
            "| language | " + " | ".join(layers) + " |", "| --- |" + " --- |" * len(layers)]
  for lang in result["order"]:
    cells = [f"{result['layers'][layer]['entropy_bits'][lang]:.2f} / {result['layers'][layer]['experts_for_90'][lang]}"
             for layer in layers]
    lines.append(f"| {lang} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def output_dir(workdir, split: str, step: int):
  return io.path(workdir) / "expert_usage" / f"{split}-{step}"


def measure(workdir, split: str = "dev", step: int | None = None, max_pairs: int | None = 2000) -> dict:
  """Counts, statistics and pictures of `workdir` (see the module's docstring); returns expert_usage.json's dict."""
  config = validate.load_saved(workdir)
  if not config.model.moe_interval:
    raise WorkdirError(f"{workdir}: a dense model (model.moe_interval=0) has no experts to count")
  run = evaluate.restore(workdir, step=step)
  layers = usage.language_counts(run, split, max_pairs)
  languages = [lang for lang in run.data.tokens[split].languages if lang in next(iter(layers.values()))]
  order, distances, tree = cluster_order(layers, languages)
  result = {"workdir": str(workdir), "step": run.step, "split": split, "router": config.moe.router,
            "num_experts": run.model_cfg.moe.num_experts, "languages": languages,
            "order": [languages[i] for i in order], "layers": statistics(layers),
            "counts": {layer: {lang: c.tolist() for lang, c in by_lang.items()} for layer, by_lang in layers.items()}}
  out = output_dir(workdir, split, run.step)
  out.mkdir(parents=True, exist_ok=True)
  io.write_atomically(out / "expert_usage.json", json.dumps(result))
  io.write_atomically(out / "report.md", report(result))
  plot_heatmaps(layers, languages, order, out / "heatmaps.png")
  plot_similarity(distances, tree, languages, order, out / "similarity.png")
  return result | {"directory": str(out)}


def main(argv):
  parser = cli.parser(__doc__)
  parser.add_argument("--workdir", required=True, help="a trained MoE run")
  parser.add_argument("--split", default="dev", choices=SPLITS)
  parser.add_argument("--step", type=int, default=None, help="the checkpoint (default: the newest)")
  parser.add_argument("--max_pairs", type=int, default=2000, help="at most this many pairs of each language")
  args = parser.parse_args(argv)
  result = measure(args.workdir, args.split, args.step, args.max_pairs)
  nmi = ", ".join(f"{layer} {s['nmi']:.3f}" for layer, s in result["layers"].items())
  print(f"wrote {result['directory']}: NMI {nmi}")


if __name__ == "__main__":
  cli.run(main)

"""docs/performance.md's tables of language-specific pruning (bench/prune_study.py) and of the upcycling study
(`make upcycle-study`)."""

from __future__ import annotations


def pruning_tables(files, provenance, table) -> list[str]:
  """One table per result file: per language and --keep, the experts kept (E' of E) and the share of the
  language's assignments they carry (the least over the MoE layers), the BLEU pruned and full."""
  if not files:
    return []
  lines = ["## Language-specific pruning: Multi30k", "",
           "`python -m gshard_mt.tools.extract --workdir W --languages L --keep p` keeps in each MoE layer the fewest "
           "experts carrying p of L's assignments (at least k, all layers as many as the neediest), counted by "
           "`tools.expert_usage` on the dev split; test_2016_flickr BLEU (beam 4) of L alone, full model and pruned, "
           "each evaluated on L's sentences only.", ""]
  for name, data, source in files:
    p = data["pruning"]
    body = [[r["language"], f"{r['keep']:g}", f"{r['num_experts']} of {p['num_experts']}",
             f"{min(r['carried'].values()):.1%}", f"{r['full_bleu']:.1f}", f"{r['bleu']:.1f}",
             f"{r['bleu'] - r['full_bleu']:+.1f}"] for r in p["rows"]]
    lines += [provenance(name, source) + f" `{p['workdir']}`: router {p['router']}, {p['num_train_steps']} steps.", ""]
    lines += table(["language", "keep", "experts", "carried (least layer)", "full BLEU", "pruned BLEU", "Δ"], body)
  return lines


def upcycling_tables(files, provenance, table) -> list[str]:
  """One table per `make upcycle-study` report: per arm, each seed's average test BLEU and last dev loss."""
  if not files:
    return []
  lines = ["## Sparse upcycling: Multi30k", "",
           "`make upcycle-study` (gshard_mt/tools/upcycle_study.py): a dense model trained N steps, then for the same "
           "M steps the dense model continued and its upcycled MoE (both `init_from` it), and a MoE from scratch for "
           "N + M steps; test_2016_flickr BLEU (beam 4) averaged over the languages, and the last dev loss.", ""]
  for name, data, source in files:
    u = data["upcycling"]
    arms = {}
    for r in u["runs"]:
      arms.setdefault(r["arm"], []).append(r)
    body = [[arm, u["dense_steps"] if arm == "dense" else u["extra_steps"] if arm in ("continued", "upcycled") else
             u["dense_steps"] + u["extra_steps"], " / ".join(f"{r['average_bleu']:.2f}" for r in rs),
             " / ".join(f"{r['curve'][-1][1]:.3f}" if r["curve"] else "-" for r in rs)] for arm, rs in arms.items()]
    lines += [provenance(name, source) + f" {u['config']}, N = {u['dense_steps']}, M = {u['extra_steps']}.", ""]
    lines += table(["arm", "steps", "test BLEU (each seed)", "last dev loss (each seed)"], body)
  return lines

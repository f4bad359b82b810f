"""docs/performance.md's table of language-specific pruning (bench/prune_study.py's JSON files)."""

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

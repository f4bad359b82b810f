"""docs/performance.md's sections on transformers checkpoints: the import's memory (bench/import_memory.py) and
decoding an imported NLLB model against transformers' generate on the same CPU (bench/hf_decode.py); rendered by
bench/report.py."""

from __future__ import annotations


def import_tables(files, provenance, table) -> list[str]:
  if not files:
    return []
  lines = ["## Importing a transformers checkpoint: peak memory", "",
           "bench/import_memory.py: tools/import_hf.py on a synthetic float32 M2M100 checkpoint of about 1 GB, in a "
           "child process whose peak resident memory getrusage reports. On a CPU the devices' memory is the host's, "
           "so the imported parameters count once there; the save to the checkpoint copies them once more.", ""]
  body = []
  for name, data, source in files:
    lines += [provenance(name, source), ""]
    body.append([data["optimizer"], f"{data['checkpoint_bytes'] / 2**30:.2f}", f"{data['peak_rss_bytes'] / 2**30:.2f}",
                 f"{data['peak_over_checkpoint']:.2f}", f"{data['seconds']:.1f}", data["import_hf_said"]])
  return lines + table(["optimizer", "checkpoint GiB", "peak GiB", "peak / checkpoint", "s", "import_hf said"], body)


def hf_decode_tables(files, provenance, table) -> list[str]:
  """One table per result file: per beam, sentences/s of each side, the ratio, our compile seconds and the rows
  whose tokens are identical."""
  if not files:
    return []
  lines = ["## Decoding an imported NLLB model: ours and transformers' generate", "",
           "`python bench/hf_decode.py` (random weights, float32, the same 16 source rows of 10-30 tokens): "
           "the median of the timed runs after a warm-up (ours: the first call, compile "
           "included; compile = first call less the median). Greedy must be the same token ids; in beam search our "
           "length penalty is GNMT's (alpha 0.6), transformers' length_penalty 1.0, so beam rows may differ.", ""]
  for name, data, source in files:
    hf = data["hf"]
    lines += [provenance(name, source) + f" {hf['kind']}, {hf['parameters'] / 1e6:.0f}M parameters, "
              f"{hf['sizes']['encoder_layers']}+{hf['sizes']['decoder_layers']} layers; transformers "
              f"{hf['transformers']} (early_stopping {hf['early_stopping']}), torch {hf['torch']} "
              f"({hf['torch_threads']} threads), max_new_tokens "
              f"{hf['max_new_tokens']}, median of {len(hf['runs']['1']['seconds'])}.", ""]
    body = [[beam, f"{r['ours_sentences_per_s']:.2f}", f"{r['theirs_sentences_per_s']:.2f}",
             f"{r['ratio_ours_over_theirs']:.2f}x", f"{r['compile_seconds']:.1f}",
             f"{r['identical_rows']} of {r['rows']}"] for beam, r in data["beams"].items()]
    lines += table(["beam", "ours sentences/s", "transformers sentences/s", "ours / theirs", "our compile s",
                    "identical rows"], body)
  return lines

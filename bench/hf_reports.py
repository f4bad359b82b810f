"""docs/performance.md's sections on Hugging Face checkpoints: the import's memory (bench/import_memory.py) and
decoding speed against transformers (bench/hf_decode.py); rendered by bench/report.py."""


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

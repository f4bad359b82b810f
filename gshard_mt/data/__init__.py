"""The input pipeline: `corpus` (sources; `tfds_source`), `tokenizer`, `prepare` (read once, tokenized in parallel,
written as `shards`), `sampling` (temperature), `packing`, `pipeline` (memory-mapped batches)."""

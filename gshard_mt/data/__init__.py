"""The input pipeline: `corpus` (`sources`), `tokenizer`, `prepare` (read once, tokenized in parallel,
written as `shards`), `sampling` (temperature), `packing`, `pipeline` (memory-mapped batches)."""

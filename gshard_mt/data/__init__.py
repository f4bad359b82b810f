"""The input pipeline: `corpus` (sources), `tokenizer`, `sampling` (temperature), `packing`, `pipeline`."""

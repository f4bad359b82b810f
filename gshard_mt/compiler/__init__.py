"""Libraries that read compiled programs and know accelerator facts: `chips` (the one table of peak FLOP/s and HBM
per chip and device), `tpu` (compile-only TPU devices and the compiler's own cost), `hlo` (loops, collectives,
costs and memory of a compiled program's text), `roofline` (its estimated time per instruction) and `parts` (the
parts of a training step that time is summed by). The commands that use them are in `gshard_mt.tools` and bench/."""

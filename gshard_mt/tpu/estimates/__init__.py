"""The TPU compiler's view of a program, on any machine with libtpu: `tpu_compiler` (compile-only devices of a
topology, the compiler's own cost), `hlo` (loops, collectives, costs and memory of a compiled program's text),
`roofline` (estimated time per instruction), `parts` (the parts of a step that time is summed by), `fusion_cost`
(each fusion compiled alone) and `step_cost` (a training step's estimate, for the dry run). Diagnostics: an
estimate is not a measurement."""

"""The GShard MoE layer (section 2.2): `config` (its options), `gating` (GShard's top-2 routing), `routers` (the
routers behind one interface, with `topk` and `expert_choice` their gating and `balance` the selection bias),
`dispatch` (moving tokens to experts), `grouped` (the experts' FFN on rows in blocks by expert, by XLA's or the
Mosaic GPU grouped matmuls), `manual` (the shard_map path), `layer` (the Flax module wiring them)."""

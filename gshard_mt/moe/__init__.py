"""The GShard MoE layer (section 2.2), its options in `gshard_mt.config.moe`: `gating` (the one top-k gating core,
GShard's top-2 its k = 2, and the `Routing` every router returns), `routers` (one registered class per moe.router,
with `expert_choice` its own gating and `balance` the selection bias), `experts` (one class per moe.dispatch: the
tokens to their experts, the experts' FFN, back), built on `dispatch` (moving tokens to capacity buffers or rows),
`grouped` (the experts' FFN on rows in blocks by expert) and `manual` (the shard_map path); `axes` (the logical axis
names), `layer` (the Flax module wiring them)."""

"""The GShard MoE layer (section 2.2): `config` (its options), `gating` (top-2 routing), `dispatch` (moving tokens
to experts), `manual` (the shard_map path), `layer` (the Flax module wiring them)."""

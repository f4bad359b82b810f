"""The GShard MoE layer (section 2.2): `gating` (the top-k core and `Routing`), `routers` (one class per
moe.router; `expert_choice`, `balance`), `experts` (one class per moe.dispatch, on `dispatch`, `grouped`, `manual`),
`axes` (logical axis names) and `layer` (the Flax module wiring them)."""

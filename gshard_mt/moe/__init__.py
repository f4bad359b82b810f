"""The GShard MoE layer: `gating` (top-2 routing), `dispatch` (moving tokens to experts), `layer` (the module)."""

from gshard_mt.moe.dispatch import DISPATCHERS, EinsumDispatcher, IndexDispatcher, make_dispatcher
from gshard_mt.moe.gating import Routing, expert_capacity, top2_gating
from gshard_mt.moe.layer import MoeFeedForward, expert_ffn

__all__ = ["DISPATCHERS", "EinsumDispatcher", "IndexDispatcher", "MoeFeedForward", "Routing", "expert_capacity",
           "expert_ffn", "make_dispatcher", "top2_gating"]

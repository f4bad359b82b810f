"""The router study: every router of `moe.router`, shared experts and bias balancing, each against the dense twin of
equal FLOPs per token, on Multi30k (configs/routers.py), two seeds per point.

  make router-study   # = python -m gshard_mt.tools.router_study --sweep configs/sweeps/routers.py

Every MoE layer computes 1,024 expert hidden units per token, as the dense twin's FFN of 768 in every layer does
on average beside the other layers' 512: top-2 of experts of hidden 512 (gshard, topk, dropless, language, bias),
top-1 of hidden 1,024 (switch), or one shared expert of 512 plus top-1 of 512 (shared). expert_choice, with k = 2
and capacity buffers of the same size as gshard's, fills every slot: 2.5 experts per token in training and 4 in
evaluation (the capacity factors 1.25 and 2.0 times k), so its encoder computes more per token than the others.
Capacity routers use the index path, the dropless ones the grouped path.
expert_choice routes the encoder only: it is not causal, so its decoder uses topk. A seed sets the initialisation,
the dropout and routing noise, and the data order (`seed`, `data.seed`); the spread between a point's seeds is
what a difference between points must beat. Finished runs are not trained again, so the study may be run in
parts; the report goes to bench/results/routers/.
"""

BASE = "configs/routers.py"
SEEDS = (0, 1)
TOP2 = {"moe.hidden_dim": 512}  # 2 x 512 hidden units per token
POINTS = {
    "dense": {"model.moe_interval": 0, "model.mlp_dim": 768},
    "gshard": {"moe.router": "gshard", **TOP2},
    "topk": {"moe.router": "topk", "moe.num_selected": 2, **TOP2},
    "switch": {"moe.router": "switch", "moe.hidden_dim": 1024},
    "expert_choice": {"moe.router": "expert_choice", "moe.decoder_router": "topk", **TOP2},
    "dropless": {"moe.router": "dropless", "moe.dispatch": "grouped", **TOP2},
    "language": {"moe.router": "language", "moe.dispatch": "grouped", **TOP2},
    "shared": {"moe.router": "topk", "moe.num_selected": 1, "moe.shared_experts": 1, **TOP2},
    "bias": {"moe.router": "topk", "moe.balance": "bias", "moe.aux_loss_weight": 0.0, **TOP2},
}


def points(seeds=SEEDS, extra: dict | None = None) -> list[dict]:
  """One run per point and seed, named '<point>_s<seed>'."""
  return [{"name": f"{name}_s{seed}", **overrides, "seed": seed, "data.seed": seed, **(extra or {})}
          for name, overrides in POINTS.items() for seed in seeds]


def get_sweep():
  return points()

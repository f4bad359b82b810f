"""Logical axis names of the MoE layer's tensors (G, S, E, C, M, H in the paper's letters; Z shared experts), for
`nn.with_logical_partitioning` and `nn.with_logical_constraint`; `gshard_mt.parallel.rules` maps them onto mesh
axes."""

ME = ("embed", None)  # the router
GSM = ("group", None, "embed")
GSE = ("group", None, None)  # router logits
GSEC = ("group", None, None, None)  # dispatch mask and combine weights
EGCM = ("expert", "group", "capacity", "embed")
EGCH = ("expert", "group", "capacity", "mlp")
# The combine input is sharded by groups only: naming E here would let E keep the 'expert' mesh axis (the rules
# give it priority) and the E -> G all-to-all would not happen.
EGCM_BY_GROUP = (None, "group", "capacity", "embed")
EMH = ("expert", "embed", "mlp")
EHM = ("expert", "mlp", "embed")
ZMH, ZHM = (None, "embed", "mlp"), (None, "mlp", "embed")  # the Z shared experts

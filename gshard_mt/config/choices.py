"""The options whose values name code: one registry each, read by the config's checks, filled by the module that
acts on the option (its `builtins`, imported by name when the registry is first read; an extension registers from
any module imported before the config is read). Plain Python, no JAX until a registry is read."""

from gshard_mt.registry import Registry

SOURCES = Registry("data.source", builtins="gshard_mt.data.sources")  # classes; 'NAME' or 'NAME:ARG'
ROUTERS = Registry("moe.router", builtins="gshard_mt.moe.routers")  # classes
SCHEDULES = Registry("optimizer.schedule", builtins="gshard_mt.training.schedules")  # classes
ATTENTIONS = Registry("model.attention", builtins="gshard_mt.model.layers")
DROPOUT_KEYS = Registry("model.dropout_rng", builtins="gshard_mt.model.layers")  # key -> the dropout masks' key
EMBEDDINGS = Registry("model.embedding", builtins="gshard_mt.model.transformer")  # scales as powers of M
REMAT_POLICIES = Registry("model.remat", builtins="gshard_mt.model.transformer")  # jax.checkpoint policies
PARTITIONINGS = Registry("partitioning", builtins="gshard_mt.parallel.rules")  # logical axis rule tables
DISPATCHES = Registry("moe.dispatch", builtins="gshard_mt.moe.experts")  # ExpertPath classes
ACTIVATIONS = Registry("moe.activation", builtins="gshard_mt.moe.experts")  # functions
GROUPED_KERNELS = Registry("moe.grouped_kernel", builtins="gshard_mt.moe.grouped")  # the grouped matmuls' classes

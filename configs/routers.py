"""The router study's model (configs/sweeps/routers.py): Multi30k (deu, fra, ces -> eng) at half configs/multi30k.py's
width and depth, one MoE layer per stack, 800 steps.

  make router-study  # writes bench/results/routers/ (python -m gshard_mt.tools.router_study --sweep ...)

Its sizing and results: docs/performance.md ("Which router wins").
"""

from gshard_mt.config import defaults


def get_config():
  c = defaults.get_config()
  c.batch_size = 32
  c.num_train_steps = 800
  c.log_every = 50
  c.eval_every = 100
  c.eval_batches = 16
  c.checkpoint_every = 100
  c.keep_checkpoints = 8  # every checkpoint of the run
  c.data.source = "multi30k"
  c.data.vocab_size = 8000
  c.data.max_length = 48
  c.data.temperature = 1.0  # the three languages have the same 29,000 pairs
  c.model.emb_dim = 128
  c.model.num_heads = 4
  c.model.head_dim = 32
  c.model.mlp_dim = 512
  c.model.num_encoder_layers = 2
  c.model.num_decoder_layers = 2
  c.model.dropout_rate = 0.1
  c.model.dtype = "float32"
  c.moe.num_experts = 4
  c.moe.hidden_dim = 512
  c.moe.group_size = 256
  c.optimizer.name = "adam"
  c.optimizer.learning_rate = 3e-3
  c.optimizer.warmup_steps = 100
  return c

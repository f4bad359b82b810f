"""The MoE-versus-dense study in miniature: Multi30k (deu, fra, ces) + Tatoeba-112 (112 languages) to English,
sampled at the paper's temperature T=5, on the tiny geometry (M=128, 2+2 layers, one MoE layer per stack).

  make study      # = python -m gshard_mt.tools.study --sweep configs/sweeps/study.py

runs every point of configs/sweeps/study.py (dense, 4-32 experts at equal FLOPs per token, bilingual baselines)
and writes the report into runs/sweeps/study/. Measured results: docs/performance.md.
"""

from gshard_mt.config import defaults


def get_config():
  c = defaults.get_config()
  c.batch_size = 16
  c.num_train_steps = 1200
  c.log_every = 50
  c.eval_every = 200
  c.eval_batches = 16
  c.checkpoint_every = 200
  c.keep_checkpoints = 7  # every checkpoint: the study decodes the one with the lowest dev loss
  c.data.source = "tatoeba+multi30k"
  c.data.temperature = 5.0
  c.data.vocab_size = 8000
  c.data.max_length = 48
  c.model.emb_dim = 128
  c.model.num_heads = 4
  c.model.head_dim = 32
  c.model.mlp_dim = 256
  c.model.num_encoder_layers = 2
  c.model.num_decoder_layers = 2
  c.model.dropout_rate = 0.1
  c.model.dtype = "float32"
  c.moe.num_experts = 4
  c.moe.hidden_dim = 256
  c.moe.group_size = 256
  c.optimizer.name = "adam"
  c.optimizer.learning_rate = 3e-3
  c.optimizer.warmup_steps = 100
  return c

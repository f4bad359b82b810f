"""Learning check on a real corpus: Multi30k (deu, fra, ces -> eng), official splits, sized for a 2-core CPU.

  python train.py --config configs/multi30k.py --workdir runs/multi30k  # test BLEU deu 30.1, fra 37.4, ces 28.7

Measurements and longer runs: docs/decisions.md ("The shipped configs' results") and docs/performance.md
("Translation quality").
"""

from gshard_mt.config import defaults


def get_config():
  c = defaults.get_config()
  c.batch_size = 32
  c.num_train_steps = 1400
  c.log_every = 50
  c.eval_every = 200
  c.eval_batches = 32  # 1,024 dev pairs, a fixed mix of the three languages
  c.checkpoint_every = 200
  c.keep_checkpoints = 10  # every checkpoint of the run, for the dev-BLEU curve
  c.data.source = "multi30k"
  c.data.vocab_size = 8000
  c.data.max_length = 48
  c.data.temperature = 1.0  # the three languages have the same 29,000 pairs
  c.model.emb_dim = 256
  c.model.num_heads = 4
  c.model.head_dim = 64
  c.model.mlp_dim = 1024
  c.model.num_encoder_layers = 4
  c.model.num_decoder_layers = 4
  c.model.dropout_rate = 0.1
  c.model.dtype = "float32"
  c.moe.num_experts = 4
  c.moe.hidden_dim = 1024
  c.moe.group_size = 256
  c.optimizer.name = "adam"
  c.optimizer.learning_rate = 1e-3
  c.optimizer.warmup_steps = 400
  return c

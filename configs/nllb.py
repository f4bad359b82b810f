"""Fine-tuning an imported NLLB-200 or NLLB-MoE model on Multi30k (deu, fra, ces -> eng); import_hf's default config.

  python -m gshard_mt.tools.import_hf --from DIR --workdir runs/nllb       # its model, this config's other keys
  python train.py --config configs/nllb.py --workdir runs/ft --config.init_from=runs/nllb

With init_from, the model and moe keys this file leaves at their defaults are the source run's (docs/config.md,
`init_from`); the tokenizer is the source's too (data.tokenizer). Adam at a small rate: the model is trained.
"""

from gshard_mt.config import defaults


def get_config():
  c = defaults.get_config()
  c.batch_size = 16
  c.num_train_steps = 1000
  c.log_every = 50
  c.eval_every = 200
  c.eval_batches = 16
  c.checkpoint_every = 200
  c.data.source = "multi30k"
  c.data.max_length = 64
  c.data.temperature = 1.0  # the three languages have the same 29,000 pairs
  c.model.dtype = "float32"  # the imported model's, exact to transformers
  c.init_from_upcycle = False  # NLLB-200, dense, is fine-tuned as it is (no MoE layers added)
  c.moe.group_size = 1024
  c.optimizer.name = "adam"
  c.optimizer.learning_rate = 3e-5
  c.optimizer.warmup_steps = 100
  c.optimizer.schedule = "constant"
  c.optimizer.label_smoothing = 0.1
  return c

"""CPU smoke test: 2+2 layers, top-2 over 4 experts every other layer, on the shipped Tatoeba-112 (112 languages).

  make train  # dev loss 3.53 / 3.16 / 3.02 at steps 200 / 400 / 600, test BLEU 0.8: learns, does not translate

It is a smoke test; configs/multi30k.py trains a model that translates. How these numbers came about:
docs/decisions.md ("The shipped configs' results").
"""

from gshard_mt.config import defaults


def get_config():
  c = defaults.get_config()
  c.batch_size = 8
  c.num_train_steps = 600
  c.log_every = 50
  c.eval_every = 200
  c.eval_batches = 16  # 128 dev pairs, one per row
  c.eval_bleu_every = 200  # greedy dev BLEU and chrF++ of up to 32 sentences of each language (3,351 in all)
  c.checkpoint_every = 200
  c.data.vocab_size = 4000
  # 8 rows of 128 source / 80 target tokens (~6 pairs each): 91.9% of the slots hold tokens, where 16 rows of
  # 48 / 48 (~2 pairs each, equal sides) fill 78% (docs/decisions.md)
  c.data.max_length = 128
  c.data.max_target_length = 80
  c.model.emb_dim = 128
  c.model.num_heads = 4
  c.model.head_dim = 32
  c.model.mlp_dim = 256
  c.model.num_encoder_layers = 2
  c.model.num_decoder_layers = 2
  c.model.dropout_rate = 0.0
  c.model.dtype = "float32"
  c.moe.num_experts = 4
  c.moe.hidden_dim = 256
  c.moe.group_size = 128  # divides both sides' tokens: 8 groups of the 1,024 source, 5 of the 640 target
  c.optimizer.name = "adam"
  c.optimizer.learning_rate = 3e-3
  c.optimizer.warmup_steps = 100
  return c

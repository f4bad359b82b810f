"""CPU smoke test: a small MoE Transformer on the shipped Tatoeba-112 corpus (all 112 languages).

  make train                                   # = python train.py --config configs/tiny.py --workdir runs/tiny
  python train.py --config configs/tiny.py --workdir runs/tiny --config.moe.num_experts=8

Expected on a 2-core CPU: the tokenizer is trained once (about 10 s), then 600 steps of 8 rows x 128 source / 80
target tokens, with the dev loss falling from ln(4000) = 8.3 at initialisation to about 3.5 at step 200 and 3.0 at
step 600 (measured 2026-11-27 on a clean clone: 1 min 56 s in all with nothing compiled yet; 3.53, 3.16, 3.02 at
steps 200 / 400 / 600 since the dev loss takes the pairs that fit the training rows, 3.49, 3.14, 3.04 before; 3.59,
3.24, 3.08 with 16 rows x 48 / 48 tokens, 73% of them real where now 91.9% are; 5.02, 4.60, 4.36 before the lossless
tokenizer and the new initialisation). Top-2 routing over 4 experts every other layer. `make eval` then decodes the
8,887 test sentences with beam 4, 8 per batch (1 min 15 s: 131 sentences/s); BLEU is low after so few steps (0.82 on
average): a smoke test, which learns but does not translate (configs/multi30k.py does). The greedy dev BLEU that
training logs (32 sentences of each language, 10-16 s per evaluation) read 0.96 / 1.11 / 1.07 at steps 200 / 400 /
600; at step 600 `make eval SPLIT=dev ARGS="--beam_size 1"` gave 0.86 on the whole dev split and `make eval
SPLIT=dev` (beam 4) 0.84 (2026-11-27).
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

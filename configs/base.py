"""One H100 (or one TPU host): a 6+6-layer MoE Transformer, 32 experts every other layer, on Tatoeba-112.

  python train.py --config configs/base.py --workdir runs/base

M=512, 8 heads, dense FFN 2048, expert FFN 2048 (top-2: 2 x 2048 per token), 512 rows x 64 source / 40 target
tokens per step (sources take ~1.6x the tokens of their targets: 92% of the slots hold tokens, 79% with 64 / 64),
bf16 computation. Compare with configs/dense_base.py (same FLOPs per token, no experts). Step time, tokens/s
and MFU go to runs/base/metrics.jsonl; the H100 figures are in docs/performance.md.

The layers are unrolled (model.scan_layers=False): on one H100 the scanned step is markedly slower, for a little
less compilation (docs/decisions.md).
"""

from gshard_mt.config import defaults


def get_config():
  c = defaults.get_config()
  c.batch_size = 512
  c.num_train_steps = 20_000
  c.log_every = 100
  c.eval_every = 1000
  c.eval_batches = 0
  c.checkpoint_every = 1000
  c.data.vocab_size = 16_000
  c.data.max_length = 64
  c.data.max_target_length = 40
  c.model.emb_dim = 512
  c.model.num_heads = 8
  c.model.head_dim = 64
  c.model.mlp_dim = 2048
  c.model.num_encoder_layers = 6
  c.model.num_decoder_layers = 6
  c.model.scan_layers = False  # unrolled: faster steps on an H100 (see the docstring)
  c.model.dtype = "bfloat16"
  c.moe.num_experts = 32
  c.moe.hidden_dim = 2048
  c.moe.group_size = 1024  # 32 groups of the source tokens, 20 of the target
  c.optimizer.name = "adafactor"
  c.optimizer.learning_rate = 0.01
  c.optimizer.warmup_steps = 2000
  return c

"""The router study's model (configs/sweeps/routers.py): Multi30k (deu, fra, ces -> eng) on a geometry small enough
that 18 runs (9 points x 2 seeds) train and decode in about 90 minutes of a 2-core CPU.

  make router-study      # = python -m gshard_mt.tools.router_study --sweep configs/sweeps/routers.py

configs/multi30k.py halved in width and depth: M=128, 4 heads of 32, 2+2 layers with one MoE layer per stack (4
experts of hidden 512, top-2: 1,024 hidden units per token, beside dense FFNs of 512), 32 rows x 48 tokens, Adam
3e-3 (configs/study.py's, which suits this width) for 800 steps, a dev loss every 100 steps and a checkpoint at
each (all kept: the study decodes the one of lowest dev loss). Sized, not yet measured: the dense twin (every FFN
of hidden 768) should pass 20 test_2016_flickr de->en BLEU by then, as configs/study.py's bilingual deu baseline
(this width, 16 rows x 600 steps of German alone, about as many German rows as deu gets here) scored 22.1; each
run should take about 5 minutes (4 of steps at an estimated 0.3 s each, 1 of evaluation and beam-4 decoding). If
the dense twin stays under 20 (the report gives each point's deu BLEU), raise num_train_steps here.
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

"""The study of configs/sweeps/study.py trained ten times longer: does the number of steps change what experts buy?

  python -m gshard_mt.tools.study --sweep configs/sweeps/study_long.py --jobs 13   # one H100: about 12 minutes

The same points, each multilingual model and each Multi30k bilingual baseline for 10x its steps (12,000 and 6,000
steps of 16 rows x 48 tokens), evaluated every 500 steps and decoded at the checkpoint (every 1,000 steps, all
kept) with the lowest dev loss. The low-resource bilingual baselines stay as they are: with a few hundred pairs
they reach their lowest dev loss within 100 steps and overfit after. Two more points ask whether more MoE layers
help: `model.moe_interval=1` puts a top-2 MoE layer of 8 experts in every layer, against a dense twin with every
FFN of hidden 512 (the same FLOPs per token).

Measured on one H100, 2026-11-24 (bench/RESULTS.md, "Ten times the steps"): best dev loss 3.203 dense against
3.166 / 3.170 / 3.170 / 3.172 with 4 / 8 / 16 / 32 experts, and 3.205 dense_all against 3.115 for e8_all; average
test BLEU 3.0-3.3 for every model; the low-resource languages gain 1-9 BLEU over their bilingual baselines, the
Multi30k streams lose 25-37.
"""

import pathlib

from gshard_mt import config as config_lib

BASE = "configs/study.py"
LONGER = 10


def longer(steps: int) -> dict:
  """10x the steps, evaluated 24 times and checkpointed 12 times, every checkpoint kept for the best-step choice."""
  every = LONGER * steps // 12
  return {"num_train_steps": LONGER * steps, "eval_every": every // 2, "checkpoint_every": every,
          "keep_checkpoints": 12}


def get_sweep():
  study = config_lib.load_module(pathlib.Path(__file__).with_name("study.py"), "get_sweep")
  base_steps = config_lib.load(pathlib.Path(__file__).parents[2] / BASE).num_train_steps
  # the low-resource baselines (data.source tatoeba) stay: they are at their best within 100 steps already
  points = [p if p.get("data.source") == "tatoeba" else p | longer(p.get("num_train_steps", base_steps))
            for p in study.get_sweep()]
  every_layer = longer(base_steps) | {"model.moe_interval": 1}
  return points + [{"name": "dense_all", **every_layer, "model.moe_interval": 0, "model.mlp_dim": 512},
                   {"name": "e8_all", **every_layer, "moe.num_experts": 8}]

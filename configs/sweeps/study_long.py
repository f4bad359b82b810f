"""The study of configs/sweeps/study.py trained ten times longer: does the number of steps change what experts buy?

  python -m gshard_mt.tools.study --sweep configs/sweeps/study_long.py --jobs 13   # one H100: 13 points side by side

The same points, each multilingual model and each Multi30k bilingual baseline for 10x its steps (12,000 and 6,000
steps of 16 rows x 48 tokens), evaluated 24 times and decoded at the checkpoint (12 per run, all kept) with the
lowest dev loss. The low-resource bilingual baselines stay as they are: with a few hundred pairs
they reach their lowest dev loss within 100 steps and overfit after. Two more points ask whether more MoE layers
help: `model.moe_interval=1` puts a top-2 MoE layer of 8 experts in every layer, against a dense twin with every
FFN of hidden 512 (the same FLOPs per token).

Result (one H100; docs/performance.md): best dev loss 3.203 dense, 3.166-3.172 with 4-32 experts, 3.115 e8_all.
"""

import pathlib

from gshard_mt import cli, config_files
from gshard_mt.tools.sweep import ROOT

STUDY = config_files.load_module(pathlib.Path(__file__).with_name("study.py"), "get_sweep")
BASE = STUDY.BASE
LONGER = 10
CHECKPOINTS = 12  # per run, all kept: the study decodes the one with the lowest dev loss


def longer(steps: int) -> dict:
  """LONGER x the steps, evaluated 2 x CHECKPOINTS times and checkpointed CHECKPOINTS times."""
  every = LONGER * steps // CHECKPOINTS
  return {"num_train_steps": LONGER * steps, "eval_every": every // 2, "checkpoint_every": every,
          "keep_checkpoints": CHECKPOINTS}


def get_sweep():
  base_steps = cli.load(ROOT / BASE).num_train_steps
  # the low-resource baselines (data.source tatoeba) stay: they are at their best within 100 steps already
  points = [p if p.get("data.source") == "tatoeba" else p | longer(p.get("num_train_steps", base_steps))
            for p in STUDY.get_sweep()]
  return points + [{"name": "dense_all", **longer(base_steps), "model.moe_interval": 0, "model.mlp_dim": 512},
                   {"name": "e8_all", **longer(base_steps), "model.moe_interval": 1, "moe.num_experts": 8}]

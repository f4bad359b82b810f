"""The dense baseline of configs/base.py: the same FLOPs per token, no experts.

  python train.py --config configs/dense_base.py --workdir runs/dense_base

base.py alternates dense FFNs of hidden 2048 with MoE layers whose tokens each pass through 2 experts of hidden
2048 (4096 in all); here every FFN has hidden 3072, which gives the same FFN FLOPs per token over the stack.
"""

import pathlib

from gshard_mt.config_files import load_file


def get_config():
  c = load_file(pathlib.Path(__file__).with_name("base.py"))
  c.model.moe_interval = 0
  c.model.mlp_dim = (c.model.mlp_dim + 2 * c.moe.hidden_dim) // 2
  return c

"""The router study of configs/sweeps/routers.py trained ten times longer, with three seeds: for a GPU.

  python -m gshard_mt.tools.router_study --sweep configs/sweeps/routers_long.py --jobs 9   # one H100

writes its report into bench/results/routers_long/. Each run: 8,000 steps (10 x 800), a dev loss every 500 and a
checkpoint every 1,000, all kept (the study decodes the one of lowest dev loss), as configs/sweeps/study_long.py
does for the MoE-versus-dense study.
"""

import pathlib

from gshard_mt import config_files

ROUTERS = config_files.load_module(pathlib.Path(__file__).with_name("routers.py"), "get_sweep")
BASE = ROUTERS.BASE
LONGER = {"num_train_steps": 8000, "eval_every": 500, "checkpoint_every": 1000, "keep_checkpoints": 8}


def get_sweep():
  return ROUTERS.points(seeds=(0, 1, 2), extra=LONGER)

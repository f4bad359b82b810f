"""GShard's MoE(128E, 36L): 37.5B parameters in the paper, on 128 devices (one expert each).

  python -m gshard_mt.tools.dryrun --config configs/moe_128e_36l.py --devices 128

The same model as configs/moe_2048e_36l.py (read its docstring for the parameter count) with 128 experts.
"""

import pathlib

from gshard_mt.config import load_file


def get_config():
  return load_file(pathlib.Path(__file__).with_name("moe_2048e_36l.py"), num_experts=128)

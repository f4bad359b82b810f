"""GShard's MoE(2048E, 12L): 200B parameters in the paper, trained on 2048 TPU v3 cores, one expert per core, at
2.15 steps/s with 4M-token batches (8192 rows x 512 tokens per side here).

  python -m gshard_mt.tools.dryrun --config configs/moe_2048e_12l.py --topology v3:32x32   # TPU compiler
  python -m gshard_mt.tools.dryrun --config configs/moe_2048e_12l.py --devices 2048   # CPU backend
  python train.py --config configs/moe_2048e_12l.py --workdir gs://.../moe_2048e_12l   # on 2048 v3 cores

The rest (float32, Adafactor, 64k vocabulary; bf16 with --config.model.dtype=bfloat16) is configs/paper/gshard.py.
Dry run: see docs/scaling.md.
"""

import pathlib

from gshard_mt.config_files import load_module


def get_config():
  paper = load_module(pathlib.Path(__file__).with_name("paper") / "gshard.py", "moe_config")
  return paper.moe_config(num_experts=2048, num_layers=12, batch_tokens=4 * 2**20)  # 4M tokens per side

"""GShard's MoE(512E, 36L): 150B parameters in the paper, trained on 512 TPU v3 cores, one expert per core, at
1.05 steps/s with 1M-token batches (2048 rows x 512 tokens per side here).

  python -m gshard_mt.tools.dryrun --config configs/moe_512e_36l.py --topology v3:16x16   # TPU compiler
  python -m gshard_mt.tools.dryrun --config configs/moe_512e_36l.py --devices 512   # CPU backend
  python train.py --config configs/moe_512e_36l.py --workdir gs://.../moe_512e_36l   # on 512 v3 cores

The rest (float32, Adafactor, 64k vocabulary; bf16 with --config.model.dtype=bfloat16) is configs/paper/gshard.py.
Dry run: see docs/scaling.md.
"""

import pathlib

from gshard_mt.config_files import load_module


def get_config():
  paper = load_module(pathlib.Path(__file__).with_name("paper") / "gshard.py", "moe_config")
  return paper.moe_config(num_experts=512, num_layers=36, batch_tokens=2**20)  # 1M tokens per side

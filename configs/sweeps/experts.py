"""Number of experts on the tiny configuration: dense, 4, 8, 16 and 32 experts (same steps, same data).

  make sweep SWEEP=configs/sweeps/experts.py              # runs every point into runs/sweeps/experts/<name>
  python -m gshard_mt.tools.sweep --sweep configs/sweeps/experts.py --print_only   # the commands, for a cluster

Results: runs/sweeps/experts/results.csv and results.md (parameters, final dev loss, tokens/s, BLEU if evaluated).
"""

BASE = "configs/tiny.py"


def get_sweep():
  return [{"name": "dense", "model.moe_interval": 0, "model.mlp_dim": 384}] + [
      {"name": f"e{e}", "moe.num_experts": e} for e in (4, 8, 16, 32)]

"""Routing choices on the tiny configuration: capacity factor, group size, second-expert policy, temperature.

  make sweep SWEEP=configs/sweeps/routing.py
"""

BASE = "configs/tiny.py"


def get_sweep():
  points = [{"name": f"cf{cf}", "moe.train_capacity_factor": cf} for cf in (0.5, 1.0, 1.25, 2.0)]
  points += [{"name": f"group{s}", "moe.group_size": s} for s in (32, 128, 1024)]  # 1024: a batch's source
  points += [{"name": f"policy_{p}", "moe.second_expert_policy": p} for p in ("all", "random")]
  points += [{"name": f"temperature{t}", "data.temperature": t} for t in (1.0, 5.0, float("inf"))]
  return points

"""Forward + backward time of the MoE layer per dispatch implementation, against a dense FFN of hidden 2H.

Reference shape (bench/RESULTS.md): 16,384 tokens, M=1024, H=4096, E=32, top-2, capacity factor 1.25,
bf16. The dense FFN of hidden 2H does the same useful FLOPs per token with no routing; every variant is reported
as a ratio to it, measured in the same process.

  python bench/moe_layer.py            # the reference shape (a GPU)
  python bench/moe_layer.py --small    # a CPU-sized shape, seconds
  python bench/moe_layer.py --experts 8,32,128 --dispatch index   # growth with E at fixed tokens

Prints one JSON line per variant, then a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from gshard_mt.moe.config import MoeConfig
from gshard_mt.moe.layer import MoeFeedForward


class DenseFFN(nn.Module):
  hidden_dim: int
  dtype: jnp.dtype

  @nn.compact
  def __call__(self, x):
    M = x.shape[-1]
    wi = self.param("wi", nn.initializers.lecun_normal(), (M, self.hidden_dim))
    wo = self.param("wo", nn.initializers.lecun_normal(), (self.hidden_dim, M))
    h = jax.nn.relu(jnp.einsum("BLM,MH->BLH", x.astype(self.dtype), wi.astype(self.dtype)))
    return jnp.einsum("BLH,HM->BLM", h, wo.astype(self.dtype))


def time_fwd_bwd(module, x, repeats: int, warmup: int = 3) -> float:
  """Median milliseconds of one jitted forward + backward (grads of params and inputs)."""
  params = nn.unbox(module.init(jax.random.key(0), x))

  def loss(params, x):
    out = module.apply(params, x, rngs={"gating": jax.random.key(1)}, **(
        {"deterministic": False} if isinstance(module, MoeFeedForward) else {}))
    y, aux = out if isinstance(out, tuple) else (out, {"aux_loss": 0.0})
    return jnp.sum(y.astype(jnp.float32) ** 2) * 1e-6 + aux["aux_loss"]

  step = jax.jit(jax.grad(loss, argnums=(0, 1)))
  for _ in range(warmup):
    jax.block_until_ready(step(params, x))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(step(params, x))
    times.append((time.perf_counter() - start) * 1e3)
  return statistics.median(times)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--small", action="store_true", help="CPU-sized shape")
  parser.add_argument("--tokens", type=int)
  parser.add_argument("--model_dim", type=int)
  parser.add_argument("--hidden_dim", type=int)
  parser.add_argument("--experts", default=None, help="comma-separated E values")
  parser.add_argument("--group_sizes", default=None, help="comma-separated S values")
  parser.add_argument("--dispatch", default="einsum,index")
  parser.add_argument("--capacity_factor", type=float, default=1.25)
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--dtype", default="bfloat16")
  args = parser.parse_args()
  small = dict(tokens=1024, model_dim=64, hidden_dim=128, experts="8", group_sizes="256")
  ref = dict(tokens=16384, model_dim=1024, hidden_dim=4096, experts="32", group_sizes="256,1024")
  shape = small if args.small else ref
  N = args.tokens or shape["tokens"]
  M = args.model_dim or shape["model_dim"]
  H = args.hidden_dim or shape["hidden_dim"]
  dtype = jnp.dtype(args.dtype)
  x = jax.random.normal(jax.random.key(2), (N // 512 if N >= 512 else 1, min(N, 512), M), dtype)
  useful_flops = N * 2 * 2 * (2 * M * H) * 3  # tokens x 2 experts x 2 matmuls x 2MH x (fwd + bwd)

  rows = []

  def report(name, ms, **extra):
    row = dict(variant=name, median_ms=round(ms, 3), tokens_per_s=round(N / ms * 1e3),
               useful_tflops=round(useful_flops / ms * 1e-9, 3), ratio_to_dense=round(dense_ms / ms, 3),
               device=jax.devices()[0].device_kind, jax=jax.__version__, N=N, M=M, H=H, **extra)
    rows.append(row)
    print(json.dumps(row), flush=True)

  dense_ms = time_fwd_bwd(DenseFFN(2 * H, dtype), x, args.repeats)
  report("dense FFN, hidden 2H", dense_ms)
  for E in [int(e) for e in (args.experts or shape["experts"]).split(",")]:
    for S in [int(s) for s in (args.group_sizes or shape["group_sizes"]).split(",")]:
      for dispatch in args.dispatch.split(","):
        cfg = MoeConfig(num_experts=E, hidden_dim=H, group_size=S, train_capacity_factor=args.capacity_factor,
                        second_expert_policy="all", dispatch=dispatch)
        layer = MoeFeedForward(cfg, dtype=dtype)
        ms = time_fwd_bwd(layer, x, args.repeats)
        report(f"MoE {dispatch} dispatch, E={E}, G={N // S} (S={S})", ms, E=E, S=S, dispatch=dispatch)

  print(f"\n{N} tokens, M={M}, H={H}, {dtype.name}, capacity factor {args.capacity_factor}, "
        f"{jax.devices()[0].device_kind}, JAX {jax.__version__}, median of {args.repeats}")
  print("| variant | median ms | useful TFLOP/s | ratio to dense 2H |\n|---|---|---|---|")
  for r in rows:
    print(f"| {r['variant']} | {r['median_ms']:.2f} | {r['useful_tflops']} | {r['ratio_to_dense']:.2f} |")


if __name__ == "__main__":
  main()

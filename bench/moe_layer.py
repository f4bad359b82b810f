"""Forward + backward of the MoE layer per dispatch implementation, against a dense FFN of hidden 2H.

Reference shape (docs/decisions.md): 16,384 tokens, M=1024, H=4096, E=32, top-2, capacity factor 1.25,
bf16. The dense FFN of hidden 2H does the same useful FLOPs per token with no routing; every variant is reported
as a ratio to it, measured (or estimated) in the same process.

  python bench/moe_layer.py            # time the reference shape (a GPU)
  python bench/moe_layer.py --small    # a CPU-sized shape, seconds
  python bench/moe_layer.py --experts 8,32,128 --dispatch index   # growth with E at fixed tokens
  python bench/moe_layer.py --tpu v5p:1x1x1     # the TPU compiler's estimate, E=8,32,128, on any machine
  python bench/moe_layer.py --tpu v5p:2x2x1     # 4 devices, experts split over them: the all-to-alls too
  python bench/moe_layer.py --tpu v5p:1x1x1 --param_dtype bfloat16   # weights arrive in bf16: no cast per step

--tpu TOPOLOGY compiles forward + backward for compile-only devices of that TPU topology (libtpu, no TPU needed)
and reports the compiler's estimate instead of a time: `optimal_seconds` of the program's cost analysis, its
roofline model, a lower bound on time. Each row splits it by kind of operation (gshard_mt.tpu.estimates.roofline: a
roofline per scheduled HLO instruction from the FLOPs and bytes in the compiled program's text, at the compiler's
own peak and bandwidth; the per-instruction sum is printed beside the total). On several devices the tokens per
device stay the reference count, the experts are split over the devices ('expert' rules) and the dense FFN runs
data parallel. The estimate of a Mosaic kernel (the grouped dispatch's `ragged_dot`) is the cost it declares.

Prints one JSON line per variant, then a table.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from gshard_mt import cli
from gshard_mt.config.moe import MoeConfig
from gshard_mt.errors import one_line
from gshard_mt.moe import ffn, grouped
from gshard_mt.moe.layer import MoeFeedForward
from gshard_mt.parallel import mesh as mesh_lib
from gshard_mt.parallel import rules as rules_lib
from gshard_mt.tpu.estimates import roofline
from gshard_mt.tpu.estimates import tpu_compiler as tpu

# bf16 rows: the grouped FFN's kernels agree with ragged_dot to about 1e-2 of the largest value (the Mosaic GPU
# kernels also round the weight gradients to bf16 once).
GROUPED_TOLERANCE = 2e-2


class DenseFFN(nn.Module):
  hidden_dim: int
  dtype: jnp.dtype
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    M = x.shape[-1]
    wi = self.param("wi", nn.initializers.lecun_normal(), (M, self.hidden_dim), self.param_dtype)
    wo = self.param("wo", nn.initializers.lecun_normal(), (self.hidden_dim, M), self.param_dtype)
    h = jax.nn.relu(jnp.einsum("BLM,MH->BLH", x.astype(self.dtype), wi.astype(self.dtype)))
    return jnp.einsum("BLH,HM->BLM", h, wo.astype(self.dtype))


def loss_fn(module):
  """(params, x) -> scalar: a loss on the layer's output (plus the MoE aux loss), for grads of params and x."""
  moe = isinstance(module, MoeFeedForward)

  def loss(params, x):
    out = module.apply(params, x, rngs={"gating": jax.random.key(1)}, **({"deterministic": False} if moe else {}))
    y, aux = out if moe else (out, {"aux_loss": 0.0})
    return jnp.sum(y.astype(jnp.float32) ** 2) * 1e-6 + aux["aux_loss"]

  return loss


def median_ms(fn, args, repeats: int, warmup: int = 3) -> float:
  """Median milliseconds of `fn(*args)` (jitted), after `warmup` calls."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append((time.perf_counter() - start) * 1e3)
  return statistics.median(times)


def time_fwd_bwd(module, x, repeats: int, warmup: int = 3) -> float:
  """Median milliseconds of one jitted forward + backward (grads of params and inputs)."""
  params = nn.unbox(module.init(jax.random.key(0), x))
  return median_ms(jax.jit(jax.grad(loss_fn(module), argnums=(0, 1))), (params, x), repeats, warmup)


def grouped_kernel_rows(rows: int, M: int, H: int, E: int, kernels: list, repeats: int) -> list[dict]:
  """The grouped FFN alone (`gshard_mt.moe.grouped`: its six grouped matmuls, forward + backward) on about `rows`
  bf16 rows in E uneven blocks, one of them empty, the rows a multiple of no tile: ms for each of `kernels`, each
  checked against XLA's ragged_dot (the largest difference of its output and gradients relative to the largest
  value of each; over GROUPED_TOLERANCE the row is marked failed)."""
  R = rows - 37
  weights = np.random.default_rng(0).uniform(0.5, 1.5, E)
  weights[E // 2] = 0
  sizes = np.floor(R * weights / weights.sum()).astype(np.int32)
  sizes[-1] += R - sizes.sum()
  keys = jax.random.split(jax.random.key(3), 3)
  args = (jax.random.normal(keys[0], (R, M), jnp.bfloat16), jax.random.normal(keys[1], (E, M, H)) / M ** 0.5,
          jax.random.normal(keys[2], (E, H, M)) / H ** 0.5)

  def value_and_grads(kernel):
    def loss(rows, wi, wo):
      layout = grouped.RowLayout(jnp.asarray(sizes), R, kernel)
      out = ffn.apply_experts(rows, ffn.ExpertWeights(wi, wo), layout, ffn.relu).astype(jnp.float32)
      return jnp.sum(out ** 2) * 1e-6, out
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))

  def relative(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))

  reference = jax.tree.leaves(value_and_grads(grouped.RaggedDot())(*args))
  out = []
  for kernel in kernels:
    row = dict(variant=f"grouped FFN alone, {kernel!r}", kernels=repr(kernel), rows=R)
    try:
      fn = value_and_grads(kernel)
      diff = max(relative(a, b) for a, b in zip(jax.tree.leaves(fn(*args)), reference))
      row |= dict(max_rel_diff_to_ragged_dot=diff)
      if diff > GROUPED_TOLERANCE:
        row |= dict(error=f"differs from ragged_dot by {diff:.1e} (over {GROUPED_TOLERANCE})")
      out.append(row | dict(ms=median_ms(fn, args, repeats)))
    except Exception as e:  # noqa: BLE001 - tiles that do not fit (shared memory) leave the others' figures
      out.append(row | dict(error=one_line(e)))
  return out


def estimate_fwd_bwd(module, x, mesh) -> dict:
  """The TPU compiler's estimate of one forward + backward on `mesh` (compile-only devices): 'ms' from
  optimal_seconds, the per-kind breakdown in ms and 'sum_ms' (the per-instruction sum)."""
  rules = rules_lib.RULES["expert"]
  boxed = jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.zeros(x.shape, x.dtype)))
  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
  params = jax.tree.map(lambda p, s: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s), nn.unbox(boxed),
                        nn.unbox(shardings))
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    compiled = jax.jit(jax.grad(loss_fn(module), argnums=(0, 1))).lower(params, x).compile()
  flops_per_s, bytes_per_s = roofline.compiler_roofline(mesh.devices.flat[0])
  parts = roofline.breakdown(compiled.as_text(), flops_per_s, bytes_per_s)
  return dict(ms=tpu.compiler_cost(compiled)["optimal_seconds"] * 1e3, sum_ms=sum(parts.values()) * 1e3,
              breakdown_ms={k: round(v * 1e3, 4) for k, v in parts.items()})


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--small", action="store_true", help="CPU-sized shape")
  parser.add_argument("--tpu", default=None, help="TPU topology (e.g. v5p:1x1x1): the compiler's estimate")
  parser.add_argument("--tokens", type=int, help="tokens (per device with --tpu)")
  parser.add_argument("--model_dim", type=int)
  parser.add_argument("--hidden_dim", type=int)
  parser.add_argument("--experts", default=None, help="comma-separated E values")
  parser.add_argument("--group_sizes", default=None, help="comma-separated S values")
  parser.add_argument("--dispatch", default=None, help="comma-separated (default einsum,index; shard_map too "
                      "with --tpu on several devices)")
  parser.add_argument("--capacity_factor", type=float, default=1.25)
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--param_dtype", default="float32", help="of the weights (the compute casts to --dtype)")
  args = parser.parse_args(argv)
  small = dict(tokens=1024, model_dim=64, hidden_dim=128, experts="8", group_sizes="256")
  ref = dict(tokens=16384, model_dim=1024, hidden_dim=4096, experts="8,32,128" if args.tpu else "32",
             group_sizes="1024" if args.tpu else "256,1024")
  shape = small if args.small else ref
  N = args.tokens or shape["tokens"]
  M = args.model_dim or shape["model_dim"]
  H = args.hidden_dim or shape["hidden_dim"]
  dtype, param_dtype = jnp.dtype(args.dtype), jnp.dtype(args.param_dtype)
  useful_flops = N * 2 * 2 * (2 * M * H) * 3  # tokens x 2 experts x 2 matmuls x 2MH x (fwd + bwd)

  if args.tpu:
    devices = tpu.topology_devices(args.tpu)
    mesh = jax.sharding.Mesh(np.array(devices).reshape(1, len(devices), 1), mesh_lib.MESH_AXES)
    dispatches = args.dispatch or ("einsum,index,grouped" if len(devices) == 1 else "einsum,shard_map")
    shape_ = (len(devices) * max(N // 512, 1), min(N, 512), M)
    with jax.set_mesh(mesh):
      x = jax.ShapeDtypeStruct(shape_, dtype, sharding=nn.logical_to_mesh_sharding(
          jax.sharding.PartitionSpec("batch", "length", "embed"), mesh, rules_lib.RULES["expert"]))
    device = f"TPU compiler estimate for {args.tpu} ({len(devices)} x {devices[0].device_kind})"
    measure = lambda module: estimate_fwd_bwd(module, x, mesh)  # noqa: E731
  else:
    x = jax.random.normal(jax.random.key(2), (N // 512 if N >= 512 else 1, min(N, 512), M), dtype)
    dispatches = args.dispatch or "einsum,index"
    device = jax.devices()[0].device_kind
    measure = lambda module: dict(ms=time_fwd_bwd(module, x, args.repeats))  # noqa: E731

  rows = []

  def report(name, result, **extra):
    ms = result["ms"]
    row = dict(variant=name, **result, tokens_per_s=round(N / ms * 1e3),
               useful_tflops=round(useful_flops / ms * 1e-9, 3), ratio_to_dense=round(dense["ms"] / ms, 3),
               device=device, jax=jax.__version__, N=N, M=M, H=H, param_dtype=param_dtype.name, **extra)
    rows.append(row)
    print(json.dumps(row), flush=True)

  dense = measure(DenseFFN(2 * H, dtype, param_dtype))
  report("dense FFN, hidden 2H", dense)
  for E in [int(e) for e in (args.experts or shape["experts"]).split(",")]:
    for S in [int(s) for s in (args.group_sizes or shape["group_sizes"]).split(",")]:
      for dispatch in dispatches.split(","):
        cfg = MoeConfig(num_experts=E, hidden_dim=H, group_size=S, train_capacity_factor=args.capacity_factor,
                        second_expert_policy="all", dispatch=dispatch)
        result = measure(MoeFeedForward(cfg, dtype=dtype, param_dtype=param_dtype))
        report(f"MoE {dispatch} dispatch, E={E}, S={S}", result, E=E, S=S, dispatch=dispatch)

  header = (f"\n{N} tokens{' per device' if args.tpu else ''}, M={M}, H={H}, {dtype.name} compute, "
            f"{param_dtype.name} weights, capacity factor {args.capacity_factor}, {device}, JAX {jax.__version__}")
  if args.tpu:
    print(f"{header}, libtpu {importlib.metadata.version('libtpu')}. Estimates: optimal_seconds (a lower bound on "
          "time); the kinds split the per-instruction roofline, whose sum is the last column.")
    kinds = roofline.KINDS
    print(f"| variant | est. ms | ratio to dense 2H | {' | '.join(kinds)} | per-op sum |")
    print("|---" * (len(kinds) + 4) + "|")
    for r in rows:
      print(f"| {r['variant']} | {r['ms']:.3f} | {r['ratio_to_dense']:.2f} | "
            + " | ".join(f"{r['breakdown_ms'][k]:.3f}" for k in kinds) + f" | {r['sum_ms']:.3f} |")
  else:
    print(f"{header}, median of {args.repeats}")
    print("| variant | median ms | useful TFLOP/s | ratio to dense 2H |\n|---|---|---|---|")
    for r in rows:
      print(f"| {r['variant']} | {r['ms']:.2f} | {r['useful_tflops']} | {r['ratio_to_dense']:.2f} |")


if __name__ == "__main__":
  cli.run(main)

"""Whether a dropout mask's random bits are drawn per device or for the whole batch on every device, for each
model.dropout_rng (XLA's partitioned program on CPU devices; the partitioner is the one GPUs and TPUs use).

  python bench/dropout_bits.py [--devices 4] [--shape 64,64,512]

Compiles the dropout of a [B, L, M] activation split over the batch on 1 and on N devices and prints XLA's cost
analysis of each device's program: bits drawn per device shrink about N-fold; bits drawn for the whole batch on
every device do not.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--devices", type=int, default=4)
  parser.add_argument("--shape", default="64,64,512", help="B,L,M of the activation")
  args = parser.parse_args(argv)
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"
  os.environ["JAX_PLATFORMS"] = "cpu"  # the CPU devices, also on a host with an accelerator
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec

  from gshard_mt.model.layers import DROPOUT_KEYS

  shape = tuple(int(n) for n in args.shape.split(","))
  print(f"dropout 0.1 of a float32 {list(shape)} activation split over the batch; cost of one device's program, "
        f"JAX {jax.__version__}, {jax.devices()[0].platform}")
  print("| dropout_rng | devices | flops per device | bytes per device |\n|---|---|---|---|")
  for name, make_key in DROPOUT_KEYS.items():
    for n in (1, args.devices):
      mesh = jax.make_mesh((n,), ("data",), (jax.sharding.AxisType.Auto,), devices=jax.devices()[:n])
      split = NamedSharding(mesh, PartitionSpec("data"))

      def drop(x, key, make_key=make_key):
        return nn.Dropout(0.1).apply({}, x, deterministic=False, rngs={"dropout": make_key(key)})

      x = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=split)
      key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=NamedSharding(mesh, PartitionSpec()))
      cost = jax.jit(drop, out_shardings=split).lower(x, key).compile().cost_analysis()
      print(f"| {name} | {n} | {cost['flops']:,.0f} | {cost['bytes accessed']:,.0f} |")


if __name__ == "__main__":
  main(sys.argv[1:])

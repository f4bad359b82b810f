"""The accelerator benchmark suite in one command: the MoE layer for every dispatch, the training steps of
configs/base.py and configs/dense_base.py, and beam-4 decoding of the test split with configs/base.py.

  make bench-gpu                       # = python bench/gpu_suite.py, on a GPU machine (about 9 minutes on an H100)
  python bench/gpu_suite.py --sections training --runs dense_base:defaults,dense_base:scanned   # some steps only
  python bench/gpu_suite.py --sections training \
      --runs base:reference,base:defaults,dense_base:reference,dense_base:defaults
      # the defaults per platform (issue 40) against the reference paths, every platform's defaults before
  python bench/gpu_suite.py --small --out /tmp/suite   # the same code at CPU sizes (a minute)
  python bench/gpu_suite.py --from_json bench/results/<date>-<device>.json   # the tables of a run a limit stopped

Writes <out>/<date>-<device>.json (default bench/results/; again after each section and each training step, with
"finished": false until the end) and prints its tables; it writes no document. docs/performance.md is generated
from the JSON files by `python bench/report.py`.
Sections:

- MoE layer: forward + backward of bench/moe_layer.py's reference shape (16,384 tokens, M=1024, H=4096, E=32,
  S=1024, capacity factor 1.25, bf16) for every dispatch of `gshard_mt.moe.experts.PATHS` and for the grouped
  dispatch with the Mosaic GPU kernels (moe.grouped_kernel), each as a ratio to the dense FFN of hidden 2H timed
  in the same process (bench/moe_layer.py's timing); then the grouped FFN alone by kernel, XLA's ragged_dot and
  the Mosaic GPU kernels with each of MOSAIC_TILES, each checked against ragged_dot.
- Training: the jitted train step of each config on its own packed batches of the Tatoeba-112 training split
  (compiled and warmed up first; batches staged on the device beforehand): step time, real tokens/s and MFU
  (`gshard_mt.training.metrics`: the step's model FLOPs as the dry run counts them, against the device's peak
  bf16 FLOP/s), for the (config, variant) pairs of RUNS, each against its config's defaults (on a GPU these include
  fused attention and the bf16 residual; VARIANTS: dropout 0, rbg dropout bits, fused attention, a bf16 residual
  stream, all of them, all with dropout 0, the layers scanned (and scanned with every unit in the loop's body), the
  index dispatch with gathers for its backward passes (alone and with all), the grouped dispatch with the Mosaic GPU
  kernels; --runs picks others).
- Profile: a few training steps of each config traced by bench/profile_step.py in a process of its own (XLA's
  GPU command buffers off): device time per step by part of the model (the parts of bench/step_breakdown.py's
  TPU estimate), the matmuls' share, the idle gaps and the longest instructions.
- Decoding: configs/base.py freshly initialised (no checkpoint), beam 4, the test split as eval.py decodes it
  (`batch_size` sentences per batch, similar lengths together): sentences/s. A fresh model seldom ends a
  hypothesis early, so most batches run to max_length: an upper bound on the time per sentence.

--small runs every section on the CPU at small shapes (configs shrunk by SMALL, few steps and sentences) with
XLA's backend optimisations off (its times are no figures), so that `make test` checks the suite end to end in
about a minute. A section that fails is recorded with its error, the others still run, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.metadata
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from gshard_mt import (  # noqa: E402
  cli,
  io,
  xla_flags,
)
from gshard_mt import config as config_lib  # noqa: E402
from gshard_mt.config import platforms  # noqa: E402
from gshard_mt.config.moe import MoeConfig  # noqa: E402
from gshard_mt.data import pipeline  # noqa: E402
from gshard_mt.errors import UserError  # noqa: E402
from gshard_mt.evaluation import evaluate  # noqa: E402
from gshard_mt.kernels import mosaic_gpu, seam  # noqa: E402
from gshard_mt.model import decode  # noqa: E402
from gshard_mt.model.transformer import Transformer, TransformerConfig  # noqa: E402
from gshard_mt.moe import grouped  # noqa: E402
from gshard_mt.moe.experts import PATHS as DISPATCHES  # noqa: E402
from gshard_mt.moe.layer import MoeFeedForward  # noqa: E402
from gshard_mt.ops import Ops  # noqa: E402
from gshard_mt.parallel import distributed  # noqa: E402
from gshard_mt.parallel import mesh as mesh_lib  # noqa: E402
from gshard_mt.training import metrics  # noqa: E402
from gshard_mt.training.setup import Setup, build  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from suite_report import markdown  # noqa: E402

CONFIGS = {"base": ROOT / "configs" / "base.py", "dense_base": ROOT / "configs" / "dense_base.py"}
# --small: the configs shrunk to compile and run in seconds on a CPU (5 languages, 2+2 layers, 4 experts).
SMALL = {"batch_size": "8", "data.languages": "fra,deu,spa,ell,kab", "data.vocab_size": "600",
         "data.max_length": "24", "data.max_target_length": "16", "model.emb_dim": "32", "model.num_heads": "2",
         "model.head_dim": "16", "model.mlp_dim": "64", "model.num_encoder_layers": "2",
         "model.num_decoder_layers": "2", "moe.num_experts": "4", "moe.hidden_dim": "64", "moe.group_size": "64"}
# The MoE layer's shapes: bench/moe_layer.py's reference shape (one group size) and its --small shape.
MOE_SHAPES = {False: dict(tokens=16384, model_dim=1024, hidden_dim=4096, experts=32, group_size=1024),
              True: dict(tokens=1024, model_dim=64, hidden_dim=128, experts=8, group_size=256)}
# The training step's variants (issue 25's options) -> config overrides; 'all' is every option but dropout 0 (and
# the layers as the config has them).
VARIANTS = {
    "defaults": {},  # `auto` as config.platforms resolves it on the device (on a GPU: fused attention and the bf16
    # residual where they apply, and the index_gather dispatch)
    # the reference paths, every platform's default before `auto` (issue 40): the "before" of the defaults
    "reference": dict(platforms.REFERENCE),
    "dropout 0": {"model.dropout_rate": "0.0"},  # MaxText's setting
    "rbg dropout bits": {"model.dropout_rng": "rbg"},
    "fused attention": {"model.attention": "fused"},  # cuDNN's flash attention
    "bf16 residual": {"model.residual_dtype": "bfloat16"},
}
VARIANTS["all"] = {k: v for overrides in list(VARIANTS.values())[3:] for k, v in overrides.items()}
VARIANTS["all and dropout 0"] = VARIANTS["all"] | VARIANTS["dropout 0"]  # the fastest step, MaxText's setting
VARIANTS["rbg and bf16 residual"] = VARIANTS["rbg dropout bits"] | VARIANTS["bf16 residual"]  # all but cuDNN
VARIANTS["scanned"] = {"model.scan_layers": "True"}  # the layers in a loop (the configs unroll them)
# the parameters stacked as scanned, the loop's body every unit (model.scan_unroll caps at the unit count)
VARIANTS["scanned unrolled"] = {"model.scan_layers": "True", "model.scan_unroll": "64"}
VARIANTS["index gather"] = {"moe.dispatch": "index_gather"}  # the MoE layer's backward gathers, no scatter-add
VARIANTS["all and index gather"] = VARIANTS["all"] | VARIANTS["index gather"]  # the fastest MoE layer on an H100
# Rows in blocks by expert, by the Mosaic GPU grouped matmuls (ragged_dot off a GPU).
VARIANTS["grouped mosaic"] = {"moe.dispatch": "grouped", "moe.grouped_kernel": "mosaic_gpu"}
# (config, variant) timed by the training section, 30 to 40 s of compiling each with the layers unrolled on an H100,
# so that the whole suite fits a 10-minute command: the two configs' defaults and all, the dense step with all and
# dropout 0, base with all and the index dispatch's gathers (the fastest MoE layer there) and with the Mosaic GPU
# grouped matmuls last (its compile took more than 90 s on 2026-11-26); each single option is one --runs away;
# --small: the defaults and all of each.
RUNS = {False: [("dense_base", "defaults"), ("base", "defaults"), ("dense_base", "all"), ("base", "all"),
                ("dense_base", "all and dropout 0"), ("base", "all and index gather"), ("base", "grouped mosaic")],
        True: [(c, v) for c in CONFIGS for v in ("defaults", "all")]}
# Tiles of the Mosaic GPU grouped matmuls that the MoE section tries (the first is the layer's own), from the
# space that JAX's own tuning of these kernels searches.
MOSAIC_TILES = (mosaic_gpu.MosaicGpu(), mosaic_gpu.MosaicGpu(grid_block_n=4), mosaic_gpu.MosaicGpu(block_m=64),
                mosaic_gpu.MosaicGpu(max_concurrent_steps=6, grid_block_n=2))
SECTIONS = ("moe_layer", "decoding", "training", "profile")  # in the order they run
SIZES = {False: dict(moe_repeats=20, train_warmup=3, train_steps=30, profile_steps=5, sentences=0),
         True: dict(moe_repeats=3, train_warmup=1, train_steps=3, profile_steps=2, sentences=24)}


def moe_layer_section(small: bool, repeats: int) -> dict:
  """Forward + backward ms of the dense FFN of hidden 2H, of the MoE layer for every dispatch (and the grouped one
  with the Mosaic GPU kernels), and of the grouped FFN alone by kernel and tiles."""
  import moe_layer  # bench/moe_layer.py, imported here so that a failure leaves the other sections

  s = MOE_SHAPES[small]
  N, M, H = s["tokens"], s["model_dim"], s["hidden_dim"]
  x = jax.random.normal(jax.random.key(2), (max(N // 512, 1), min(N, 512), M), jnp.bfloat16)
  useful_flops = N * 2 * 2 * (2 * M * H) * 3  # tokens x 2 experts x 2 matmuls x 2MH x (forward + backward)
  dense_ms = moe_layer.time_fwd_bwd(moe_layer.DenseFFN(2 * H, jnp.bfloat16), x, repeats)
  rows = [dict(variant="dense FFN, hidden 2H", ms=dense_ms)]
  on_gpu = jax.default_backend() == "gpu"  # the Mosaic GPU kernels run there only (elsewhere: ragged_dot again)
  for dispatch, kernel in [(d, "ragged_dot") for d in DISPATCHES] + [("grouped", "mosaic_gpu")] * on_gpu:
    cfg = MoeConfig(num_experts=s["experts"], hidden_dim=H, group_size=s["group_size"], train_capacity_factor=1.25,
                    second_expert_policy="all", dispatch=dispatch, grouped_kernel=kernel)
    row = dict(variant=f"MoE {dispatch} dispatch", dispatch=dispatch)
    try:
      # the kernels the seam picks here (the Mosaic GPU ones on a Hopper GPU only; None: ragged_dot)
      model_cfg = TransformerConfig.reference(vocab_size=8, emb_dim=M, dtype="bfloat16", moe=cfg)
      ops = Ops(grouped_matmuls=seam.grouped_matmuls(model_cfg, jax.devices()[0]))
      if dispatch == "grouped":
        row |= dict(kernels=repr(ops.grouped_matmuls or grouped.RaggedDot()))
        row["variant"] += f", {row['kernels']}"
      layer = MoeFeedForward(cfg, dtype=jnp.bfloat16, ops=ops)
      rows.append(row | dict(ms=moe_layer.time_fwd_bwd(layer, x, repeats)))
    except Exception as e:  # noqa: BLE001 - one dispatch failing leaves the others' figures
      rows.append(row | dict(error=_error(e)))
  kernels = [grouped.RaggedDot()] + list(MOSAIC_TILES) * on_gpu
  rows += moe_layer.grouped_kernel_rows(2 * N, M, H, s["experts"], kernels, repeats)
  for row in rows:
    if "ms" in row:
      row.update(useful_tflops=useful_flops / row["ms"] * 1e-9, ratio_to_dense=dense_ms / row["ms"])
  return dict(shape=s | dict(capacity_factor=1.25, dtype="bfloat16", repeats=repeats), rows=rows)


@dataclasses.dataclass
class Prepared:
  """A config with its data (the tokenizer trained once in the suite's work directory), setup and fresh state."""

  config: Any
  data: pipeline.Data
  setup: Setup
  state: Any


def prepare(name: str, variant: str, *, small: bool, workdir: pathlib.Path) -> Prepared:
  overrides = (SMALL if small else {}) | VARIANTS[variant]
  config = cli.load(CONFIGS[name], overrides)
  mesh_lib.check(config, jax.device_count())
  data = pipeline.load(config, workdir)
  setup = build(config, data.tokenizer.vocab_size)
  return Prepared(config, data, setup, setup.init_state(config.seed))


def training_section(prepared: Callable[[str, str], Prepared], name: str, variant: str, warmup: int,
                     steps: int) -> dict:
  """The config's jitted train step (with a variant's overrides) on its packed training batches: step time, real
  tokens/s, MFU."""
  p = prepared(name, variant)
  config, setup, state = p.config, p.setup, p.state
  step_fn = setup.jit_train_step(Transformer(setup.model_cfg, deterministic=False), config)
  batches = p.data.train_batches(config)
  with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
    staged = [distributed.global_batch(next(batches)[1], setup.mesh, setup.rules) for _ in range(warmup + steps)]
    start = time.perf_counter()
    for batch in staged[:warmup]:
      state, _ = step_fn(state, batch)
    jax.block_until_ready(state)
    compile_and_warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    timed = []
    for batch in staged[warmup:]:
      state, step_metrics = step_fn(state, batch)
      timed.append(step_metrics)
    jax.block_until_ready(state)
    seconds = (time.perf_counter() - start) / steps
  timed = jax.device_get(timed)
  sides = np.mean([(float(m["source_tokens"]), float(m["target_tokens"])) for m in timed], axis=0)
  flops = metrics.step_flops(state.params, config.moe, *sides)
  return dict(config=f"configs/{name}.py", steps=steps, step_ms=seconds * 1e3, tokens_per_step=float(sum(sides)),
              tokens_per_s=float(sum(sides)) / seconds, step_tflops=flops * 1e-12,
              mfu=metrics.mfu(flops / seconds, jax.devices()[0], jax.device_count()),
              compile_and_warmup_s=compile_and_warmup_s, packing_efficiency=batches.packing_efficiency,
              batch_size=config.batch_size, row_lengths=config_lib.row_lengths(config),
              losses=[float(timed[0]["loss"]), float(timed[-1]["loss"])],  # the timed steps' first and last
              skipped_steps=sum(not bool(m["finite"]) for m in timed))  # updates skipped: not finite


def profile_section(small: bool, name: str, warmup: int, steps: int) -> dict:
  """The config's train step traced by bench/profile_step.py in a process of its own (which turns XLA's GPU
  command buffers off before its backend starts): device time per step by part."""
  with tempfile.TemporaryDirectory() as folder:
    out = pathlib.Path(folder) / "profile.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "profile_step.py"), "--config", str(CONFIGS[name]),
                           "--warmup", str(warmup), "--steps", str(steps), "--json", str(out)] + ["--small"] * small,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode:
      sys.stderr.write(done.stderr)
      raise RuntimeError(f"bench/profile_step.py exited with {done.returncode}: "
                         f"{(done.stderr.strip().splitlines() or [''])[-1]}")
    return json.loads(out.read_text())


def decoding_section(prepared: Callable[[str, str], Prepared], sentences: int, beam: int = 4) -> dict:
  """Beam search over the test split with configs/base.py, freshly initialised (before its training section, which
  donates the state): sentences/s as eval.py times them."""
  p = prepared("base", "defaults")
  config, data, model_cfg = p.config, p.data, p.setup.model_cfg
  run = evaluate.Restored(None, config, data, model_cfg, 0, p.state.params)
  n = len(data.tokens["test"])
  ids = np.random.default_rng(0).permutation(n)[: sentences or n]
  translator = decode.Translator(model_cfg, run.params, beam, 0.6, config.data.max_length)
  start = time.perf_counter()
  _, speed = evaluate.decode_pairs(translator, run, split="test", ids=ids, rows=config.batch_size, progress=False)
  return dict(config="configs/base.py", params="fresh initialisation", beam=beam, alpha=0.6,
              batch_size=config.batch_size, max_length=config.data.max_length, sentences=speed["sentences"],
              seconds=speed["seconds"], sentences_per_s=speed["sentences"] / speed["seconds"],
              tokens_per_s=speed["tokens"] / speed["seconds"],
              untimed_s=time.perf_counter() - start - speed["seconds"])  # batching, compiling, a warm-up batch


def _error(e: BaseException) -> str:
  traceback.print_exc()
  return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]


def environment() -> dict:
  device = jax.devices()[0]
  git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
  # "+changes": the tracked files differ from the commit (a copy of a working tree, as on a lent GPU machine).
  commit = git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "-uno") else "")
  versions = {p: importlib.metadata.version(p) for p in ("jax", "jaxlib", "flax")}
  return dict(date=datetime.date.today().isoformat(), device=device.device_kind, platform=device.platform,
              device_count=jax.device_count(), commit=commit or None,
              xla_flags=os.environ.get("XLA_FLAGS", "").strip(), **versions)  # with the GPU flags cli.run adds


def slug(text: str) -> str:
  return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def small_backend():
  """--small's backend, set before JAX starts it: the CPU, where compiling fast matters, not the code's speed."""
  jax.config.update("jax_platforms", "cpu")
  xla_flags.add((("xla_backend_optimization_level", "0"),))


def run_section(fn, *args) -> dict:
  start = time.perf_counter()
  try:
    out = fn(*args)
  except Exception as e:  # noqa: BLE001 - the other sections still run; the exit status says it failed
    out = dict(error=_error(e))
  print(f"{fn.__name__} ({time.perf_counter() - start:.0f} s): {json.dumps(out, default=str)}", flush=True)
  return out


def main(argv) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--small", action="store_true", help="CPU-sized shapes, seconds per section")
  parser.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder of the JSON file")
  parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, of " + ",".join(SECTIONS))
  parser.add_argument("--runs", default="", help="the training section's config:variant pairs, comma-separated "
                      "(default: RUNS), e.g. dense_base:defaults,dense_base:scanned")
  parser.add_argument("--profiles", default=",".join(CONFIGS), help="the profile section's configs, "
                      "comma-separated, of " + ",".join(CONFIGS))
  parser.add_argument("--from_json", default="", help="print the tables of a JSON this suite wrote (one a time "
                      "limit stopped, say), and run nothing")
  args = parser.parse_args(argv)
  if args.from_json:
    print(markdown(json.loads(pathlib.Path(args.from_json).read_text())))
    return 0
  sections = args.sections.split(",")
  runs = [tuple(run.split(":", 1)) for run in args.runs.split(",") if run] or RUNS[args.small]
  for section in sections:
    if section not in SECTIONS:
      raise UserError(f"--sections: unknown section {section!r}; expected some of {','.join(SECTIONS)}")
  for run in runs:
    if len(run) != 2 or run[0] not in CONFIGS or run[1] not in VARIANTS:
      raise UserError(f"--runs: {':'.join(run)!r} is not config:variant with a config of {sorted(CONFIGS)} and a "
                      f"variant of {sorted(VARIANTS)}")
  profiles = [name for name in args.profiles.split(",") if name]
  if any(name not in CONFIGS for name in profiles):
    raise UserError(f"--profiles: {args.profiles!r} names a config not of {','.join(CONFIGS)}")
  if args.runs and "training" not in sections:
    raise UserError(f"--runs chooses the training section's steps, but --sections {args.sections} leaves it out")
  if args.small:
    small_backend()
  # Accelerator memory as needed, not JAX's 75% of it: the profile's own process needs its share of the GPU.
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  start = time.perf_counter()
  sizes = SIZES[args.small]
  result = dict(environment=environment(), small=args.small,
                command=shlex.join(["python", "bench/gpu_suite.py", *argv]), finished=False)
  env = result["environment"]
  path = pathlib.Path(args.out) / f"{env['date']}-{slug(env['device'])}{'-small' if args.small else ''}.json"
  result["json"] = os.path.relpath(path, ROOT) if path.resolve().is_relative_to(ROOT) else str(path)
  path.parent.mkdir(parents=True, exist_ok=True)

  def save(**done):
    """The JSON with what has run so far (finished=False until the end), written again after each section and
    each training step: a run stopped by a time limit keeps its figures."""
    result.update(done, seconds=time.perf_counter() - start)
    io.write_atomically(path, json.dumps(result, indent=2, default=str) + "\n")

  with tempfile.TemporaryDirectory() as workdir:  # the tokenizer, trained once for both configs
    prepared = functools.cache(functools.partial(prepare, small=args.small, workdir=pathlib.Path(workdir)))
    if "moe_layer" in sections:
      save(moe_layer=run_section(moe_layer_section, args.small, sizes["moe_repeats"]))
    if "decoding" in sections:
      save(decoding=run_section(decoding_section, prepared, sizes["sentences"]))
    if "training" in sections:
      result["training"] = []
      for name, variant in runs:
        result["training"].append({"config": f"configs/{name}.py", "variant": variant} | run_section(
            training_section, prepared, name, variant, sizes["train_warmup"], sizes["train_steps"]))
        save()
    if "profile" in sections:
      result["profile"] = []
      for name in profiles:
        result["profile"].append({"config": f"configs/{name}.py"} | run_section(
            profile_section, args.small, name, sizes["train_warmup"], sizes["profile_steps"]))
        save()
  save(finished=True)
  print(f"\n{markdown(result)}\nwrote {path} (docs/performance.md: python bench/report.py)")
  moe = result.get("moe_layer", {})
  failed = "error" in moe or any("error" in r for r in moe.get("rows", []) + result.get("training", []) + result.get(
      "profile", [])) or "error" in result.get("decoding", {})
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(cli.run(main))

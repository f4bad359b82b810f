#!/usr/bin/env bash
# Issue 40's measurements on a lent GPU in one command of under 10 minutes, each part under a time limit of its own,
# the most wanted first; every part writes its JSON as it goes, so a part a limit stops keeps what it measured and
# the parts after it still run:
#
#   bash bench/gpu_check.sh [OUT]        # OUT: default bench/results/gpu-<date>; needs the packages of pyproject.toml
#
# 1. the training step of configs/base.py (bench/gpu_suite.py), with the loss of its first and last timed step and
#    the updates skipped as not finite: the defaults (`auto`: on a GPU the index dispatch's gathers), each of the
#    faster options that stopped learning together on an H200 (2026-11-27: cuDNN attention, rbg dropout bits, the
#    bf16 residual stream) on top of them, to find the one at fault, the reference paths (every platform's defaults
#    before `auto`) and all three options together;
# 2. start to first step of train.py with a cold and a warm compilation cache (bench/cache_start.py);
# 3. the fused attention's unit tests run on the GPU (cuDNN against XLA's attention, no empty query row).
# The profile of a step by part is one more command: bench/gpu_suite.py --sections profile --profiles base (90 s).
# OUT gets env.txt (device, driver, versions), suite/ (bench/gpu_suite.py's JSON), cache.json
# (bench/cache_start.py's); `python bench/report.py` puts them in docs/performance.md once they are under
# bench/results/.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/gpu-$(date +%F)}
PY=${PYTHON:-python3}
mkdir -p "$OUT/suite"
export PYTHONUNBUFFERED=1
status=0
part() {  # part SECONDS COMMAND...: runs it under its limit, says how long it took and how it ended
  local limit=$1 start=$SECONDS rc
  shift
  echo "== $* (limit $limit s)"
  timeout "$limit" "$@"
  rc=$?
  echo "== exit $rc after $((SECONDS - start)) s: $*"
  [ "$rc" = 0 ] || status=1
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv
  $PY -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__,
jax.devices())"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
part 375 $PY bench/gpu_suite.py --out "$OUT/suite" --sections training --runs "base:defaults,\
base:fused attention,base:rbg dropout bits,base:bf16 residual,base:reference,base:all"
part 115 $PY bench/cache_start.py --config configs/base.py --out "$OUT/cache.json" --timeout 95
part 60 $PY -m pytest -v -p no:cacheprovider tests/unit/test_fused_attention.py
exit $status

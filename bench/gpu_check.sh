#!/usr/bin/env bash
# Issue 40's measurements on a lent GPU in one command of under 10 minutes (9.3 on an H200, 2026-11-27), each part
# under a time limit of its own, the most wanted first; every part writes its JSON as it goes, so a part a limit
# stops keeps what it measured and the parts after it still run:
#
#   bash bench/gpu_check.sh [OUT]        # OUT: default bench/results/gpu-<date>; needs the packages of pyproject.toml
#
# 1. the training steps (bench/gpu_suite.py), with the loss of their first and last timed step and the updates
#    skipped as not finite: configs/dense_base.py with its defaults and with each of the faster options that
#    stopped learning together on an H200 (2026-11-27: cuDNN attention, rbg dropout bits, the bf16 residual
#    stream), to find the one at fault; then configs/base.py with the defaults (`auto`: on a GPU the index
#    dispatch's gathers) against the reference paths (every platform's defaults before `auto`);
# 2. the profile of base's default step by part (bench/profile_step.py, through the suite);
# 3. start to first step of train.py with a cold and a warm compilation cache (bench/cache_start.py);
# 4. the unit tests of the GPU paths, run on the GPU (cuDNN attention against XLA's, the
#    dispatches' gradients, the rbg masks, the bf16 stream).
# OUT gets env.txt (device, driver, versions), suite/ and profile/ (bench/gpu_suite.py's JSON), cache.json
# (bench/cache_start.py's); `python bench/report.py` puts them in docs/performance.md once they are under
# bench/results/.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/gpu-$(date +%F)}
PY=${PYTHON:-python3}
mkdir -p "$OUT/suite" "$OUT/profile"
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
part 320 $PY bench/gpu_suite.py --out "$OUT/suite" --sections training --runs "dense_base:defaults,\
dense_base:fused attention,dense_base:rbg dropout bits,dense_base:bf16 residual,base:defaults,base:reference"
part 90 $PY bench/gpu_suite.py --out "$OUT/profile" --sections profile --profiles base
part 120 $PY bench/cache_start.py --config configs/base.py --out "$OUT/cache.json" --timeout 100
part 55 $PY -m pytest -q -p no:cacheprovider tests/unit/test_fused_attention.py tests/unit/test_dispatch.py \
  tests/unit/test_residual_dtype.py tests/unit/test_dropout_rng.py tests/unit/test_platforms.py
exit $status

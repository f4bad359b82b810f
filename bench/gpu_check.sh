#!/usr/bin/env bash
# Issue 40's measurements on a lent GPU in one command of under 10 minutes, each part under a time limit of its own,
# the most wanted first; every part writes its JSON as it goes, so a part a limit stops keeps what it measured and
# the parts after it still run:
#
#   bash bench/gpu_check.sh [OUT]        # OUT: default bench/results/gpu-<date>; needs the packages of pyproject.toml
#
# 1. the training steps of configs/base.py and configs/dense_base.py (bench/gpu_suite.py), with the loss of their
#    first and last timed step and the updates skipped as not finite: the defaults (`auto`: on a GPU cuDNN
#    attention, the bf16 residual stream and the index dispatch's gathers) against the reference
#    paths (every platform's defaults before `auto`);
# 2. the profile of base's default step by part (bench/profile_step.py, through the suite);
# 3. start to first step of train.py with a cold and a warm compilation cache (bench/cache_start.py);
# 4. the unit tests of the GPU defaults run on the GPU (cuDNN against XLA's attention, the bf16 stream).
# On an H200 (2026-11-27) the first part took 1 min a step variant, the cache part 108 s.
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
part 260 $PY bench/gpu_suite.py --out "$OUT/suite" --sections training --runs "base:defaults,base:reference,\
dense_base:defaults,dense_base:reference"
part 95 $PY bench/gpu_suite.py --out "$OUT/profile" --sections profile --profiles base
part 115 $PY bench/cache_start.py --config configs/base.py --out "$OUT/cache.json" --timeout 95
part 90 $PY -m pytest -v -p no:cacheprovider tests/unit/test_fused_attention.py tests/unit/test_residual_dtype.py \
  -k "bfloat16 or cudnn or fused_mask or residual"
exit $status

#!/usr/bin/env bash
# Last call of the sixth session: every gpu test on final main.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 330 python3 -m pytest -q -p no:cacheprovider \
    -n 8 -m gpu tests/ > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head -20

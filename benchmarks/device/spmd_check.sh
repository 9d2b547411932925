#!/usr/bin/env bash
# Lead, end of the fifth 2026-11-26 session: the multi-GPU SPMD tests after the partitioned
# module's pipeline got its GPU's fusion target (two GPUs).
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 20 python3 -m compileall -q -j 0 hlo passes codegen runtime > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 130 python3 -m pytest -q -p no:cacheprovider -x \
    tests/test_spmd_multiprocess.py > $OUT/t.log 2>&1
echo "spmd tests rc $?"; grep -E "passed|failed" $OUT/t.log | tail -1
grep -E "^FAILED|^ERROR|^E  " $OUT/t.log | head -10

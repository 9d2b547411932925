#!/usr/bin/env bash
# Session 9, final call A: every gpu test on final main; the gpu suite (device time now on
# the call's own data); adam_step's loop emitters and CUDA C division/sqrt modes on it.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 330 python3 -m pytest -q -p no:cacheprovider \
    -n 8 -m gpu tests/ > /tmp/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" /tmp/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" /tmp/t_gpu.log | head -20; cp /tmp/t_gpu.log $OUT/
timeout 200 python3 -m benchmarks.emitter_ab --only adam_step --rounds 7 \
    --sides "auto;chunk:HLOTK_CUDA_C_FLAT_DIVSQRT=chunk;approx:HLOTK_CUDA_C_FLAT_DIVSQRT=approx;triton" \
    > /tmp/ab.log 2>&1; echo "emitter_ab rc $?"; grep -E "^\{|Error" /tmp/ab.log | tail -3; cp /tmp/ab.log $OUT/

#!/usr/bin/env bash
# Session 8, final call A: every gpu test on final main, then the gpu suite (device time and
# ratios against XLA: flat loops in CUDA C at every size, the fusion pre-pass).
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 320 python3 -m pytest -q -p no:cacheprovider \
    -n 8 -m gpu tests/ > /tmp/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" /tmp/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" /tmp/t_gpu.log | head -20; cp /tmp/t_gpu.log $OUT/
timeout 230 python3 -m benchmarks.gpu_suite --out /tmp/suite.md > /tmp/suite.log 2>&1
echo "gpu_suite rc $?"; grep "^| [A-Za-z]" /tmp/suite.md | grep -v "^| program" | cut -d'|' -f2,3,4,5,6,7,8,12 | cut -c1-260
cp /tmp/suite.md $OUT/

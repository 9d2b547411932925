#!/usr/bin/env bash
# Session 9, final call D: the gpu suite's device ratios against XLA after the session's
# autotune and tile changes (device time now replayed on the call's own arguments).
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
timeout 300 python3 -m benchmarks.gpu_suite --out /tmp/suite.md > /tmp/suite.log 2>&1
echo "gpu_suite rc $?"; grep "^| [A-Za-z]" /tmp/suite.md | grep -v "^| program" | cut -d'|' -f2,3,4,5,6,7,8,12 | cut -c1-200
cp /tmp/suite.md $OUT/

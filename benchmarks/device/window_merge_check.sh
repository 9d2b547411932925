#!/usr/bin/env bash
# Lead, third 2026-11-26 session, after merging i14-window: the attention/epilogue gpu tests,
# the suite's transformer block and the jax.nn forward rows (the causal path's key ranges
# changed), one device call.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 280 python3 -m pytest -q -p no:cacheprovider -n 4 \
    -m gpu -rA tests/test_attention_variants.py tests/test_fusion_attention.py \
    tests/test_gemm_epilogue.py > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head
grep -c "^PASSED.*window" $OUT/t_gpu.log
timeout 90 python3 -m benchmarks.gpu_suite --only transformer --out $OUT/gpu_suite.md > $OUT/suite.log 2>&1
echo "gpu_suite rc $?"; grep "^| transformer" $OUT/gpu_suite.md | cut -d'|' -f2-8
timeout 100 python3 -m benchmarks.attention --only dpa_fwd > $OUT/dpa.log 2>&1
echo "dpa rc $?"; grep "pipelined" $OUT/dpa.log | cut -c1-160

#!/usr/bin/env bash
# Lead, end of the fifth 2026-11-26 session: gpu tests of what changed after the final
# validation (attention.py split into attention_masks.py; level 1 times no loop kernel).
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 30 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 \
    -m gpu tests/test_fusion_attention.py tests/test_attention_variants.py tests/test_autotune.py \
    tests/test_kernel_dedup.py tests/test_split_gemm.py tests/test_cuda_runtime.py \
    > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head -20

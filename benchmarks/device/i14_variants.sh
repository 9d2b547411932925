#!/usr/bin/env bash
# One device call for i14-variants: the gpu tests of the attention test files (jax.nn's
# grouped-query gradient and the sliding-window gradient on the Triton kernels, the
# backward kernels' Q_DIV causal test and grouped-row block skipping) and the jax.nn
# dot_product_attention timings with the GQA gradient row.
#   bash benchmarks/device/i14_variants.sh      (logs under $OUT)
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 170 python3 -m pytest -q -p no:cacheprovider -n 3 \
    -m gpu tests/test_attention_variants.py tests/test_fusion_attention.py > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR|Error" $OUT/t_gpu.log | head -20 | cut -c1-300
timeout 200 python3 -m benchmarks.attention --only dpa,gqa_forms > $OUT/dpa.log 2>&1
echo "dpa rc $?"; grep -v "^ \|Warn\|warn" $OUT/dpa.log | tail -26 | cut -c1-200

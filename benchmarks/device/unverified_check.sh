#!/usr/bin/env bash
# One device call for what the second 2026-11-26 session merged after its last GPU run:
# the attention and codegen gpu tests, jax.nn.dot_product_attention timings (GQA with the
# Q_DIV causal path), GIOU without its root copy, and the cold/warm first calls.
#   bash benchmarks/device/unverified_check.sh      (logs and tables under $OUT)
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -m pytest -q -p no:cacheprovider -n 3 \
    -m gpu tests/test_fusion_attention.py tests/test_minor_tiles.py tests/test_cuda_runtime.py \
    > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head
timeout 120 python3 -m benchmarks.attention --only dpa > $OUT/dpa.log 2>&1
echo "dpa rc $?"; grep -v "^ \|Warn\|warn" $OUT/dpa.log | tail -10 | cut -c1-200
timeout 80 python3 -m benchmarks.gpu_suite --only giou,softmax,transformer --out $OUT/gpu_suite.md \
    > $OUT/suite.log 2>&1
echo "gpu_suite rc $?"; grep "^|" $OUT/gpu_suite.md | cut -c1-240
timeout 150 python3 -m benchmarks.compile_time --autotune 1 --only transformer,mlp_train,softmax \
    --out $OUT/compile_time.md > $OUT/compile.log 2>&1
echo "compile_time rc $?"; grep "^|" $OUT/compile_time.md | cut -c1-220

#!/usr/bin/env bash
# One device call for i14-window: sliding-window timings (--only window: B2 H16 S8192 D128
# bf16, window 1024, hlotk vs XLA and cuDNN, beside hlotk's full causal), then the gpu
# tests of the attention test files (the window cases, and the causal ones whose kernels
# now have a third key range); between them jax.nn's forward rows (--only dpa_fwd: the
# GQA forward now reads q and writes O in place).
#   bash benchmarks/device/i14_window.sh      (logs under $OUT)
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 25 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
timeout 100 python3 -m benchmarks.attention --only window > $OUT/window.log 2>&1
echo "window rc $?"; grep -v "^ \|Warn\|warn" $OUT/window.log | tail -22 | cut -c1-200
timeout 55 python3 -m benchmarks.attention --only dpa_fwd > $OUT/dpa.log 2>&1
echo "dpa_fwd rc $?"; grep -v "^ \|Warn\|warn" $OUT/dpa.log | tail -9 | cut -c1-200
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 110 python3 -m pytest -q -p no:cacheprovider -n 4 \
    -m gpu tests/test_attention_variants.py tests/test_fusion_attention.py > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR|Error" $OUT/t_gpu.log | head -20 | cut -c1-300

#!/usr/bin/env bash
# Session 7, final call B: cold and warm first calls of every gpu_suite program beside
# XLA's lower+compile (issue 13), and the held-out programs' device time.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false HLOTK_CACHE_DIR=/tmp/hc_t timeout 100 python3 -m pytest -q -p no:cacheprovider \
    -m gpu tests/test_flat_loop.py tests/test_kernel_dedup.py tests/test_cuda_c.py > /tmp/t3.log 2>&1
echo "gpu tests (flat, dedup, cuda_c) rc $?"; grep -E "passed|failed" /tmp/t3.log | tail -1
MC=$(mktemp -d)
timeout 300 python3 -m benchmarks.compile_time --autotune 1 --machine-cache $MC \
    --out /tmp/ct.md > /tmp/ct.log 2>&1
echo "compile_time rc $?"; grep -E "^\| [a-z]" /tmp/ct.md | grep -v "^| program" | cut -c1-330
cp /tmp/ct.md /tmp/ct.json $OUT/ 2>/dev/null
HLOTK_CACHE_DIR=/tmp/hlotk_cache timeout 200 python3 -m benchmarks.gpu_suite --heldout \
    --only lstm_grad,gpt_train_step,moe_grad,conv_bn_grad,kv_decode,llama_block \
    --out /tmp/heldout.md > /tmp/heldout.log 2>&1
echo "heldout rc $?"; grep "^| [A-Za-z]" /tmp/heldout.md | grep -v "^| program" | cut -d'|' -f2,3,4,5,6,7,8,12 | cut -c1-260
cp /tmp/heldout.md $OUT/

#!/usr/bin/env bash
# i13-resnet-cold, one device call: conv_bn_grad's cold first call before (the three new
# switches off: what main does) and after, with lstm_grad and moe_grad beside it; XLA's
# lower+compile in the same child; then the gpu tests of what the branch touches.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
MC=$(mktemp -d)
BEFORE=HLOTK_TUNE_FROM_US=0,HLOTK_WARM_LIBRARIES=0,HLOTK_PREWARM_LIBRARIES=0
show() {   # the rows, their pool and library lines
  grep -E "^\| [a-z]|^POOL|^LIB|FAILED|Error" /tmp/ct_$1.log | grep -v "^| program" | cut -c1-700
  cp /tmp/ct_$1.md /tmp/ct_$1.json /tmp/ct_$1.log $OUT/ 2>/dev/null
}
run_ct() {  # tag, seconds, programs, env
  timeout $2 python3 -m benchmarks.compile_time --autotune 1 --machine-cache $MC --runs cold \
      --child-timeout 60 --only $3 ${4:+--env $4} --tag=-$1 --out /tmp/ct_$1.md > /tmp/ct_$1.log 2>&1
  echo "== $1 rc $?"; show $1
}
run_ct before 85 conv_bn_grad,lstm_grad,moe_grad $BEFORE
run_ct after 85 conv_bn_grad,lstm_grad,moe_grad
XLA_PYTHON_CLIENT_PREALLOCATE=false HLOTK_CACHE_DIR=/tmp/hlotk_cache timeout 70 python3 -m pytest -q \
    -p no:cacheprovider -n 8 tests/test_cudnn_conv.py tests/test_library_warm.py tests/test_autotune.py \
    tests/test_compile_caches.py > /tmp/t_a.log 2>&1
echo "tests A rc $?"; grep -E "passed|failed" /tmp/t_a.log | tail -1; grep -E "^FAILED|^ERROR" /tmp/t_a.log | head
XLA_PYTHON_CLIENT_PREALLOCATE=false HLOTK_CACHE_DIR=/tmp/hlotk_cache timeout 80 python3 -m pytest -q \
    -p no:cacheprovider -n 8 -m gpu tests/test_cuda_runtime.py tests/test_gemm_epilogue.py \
    tests/test_split_gemm.py tests/test_kernel_dedup.py > /tmp/t_b.log 2>&1
echo "tests B rc $?"; grep -E "passed|failed" /tmp/t_b.log | tail -1; grep -E "^FAILED|^ERROR" /tmp/t_b.log | head
cp /tmp/t_a.log /tmp/t_b.log $OUT/
run_ct nothread 35 conv_bn_grad HLOTK_PREWARM_LIBRARIES=0
run_ct again 35 conv_bn_grad

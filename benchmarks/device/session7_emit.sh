#!/usr/bin/env bash
# Session 7, call 4: the merged flat loop kernels (i13-generic) and CUDA C loop emitter
# (i13-nvrtc) on the H200. Device time in one process, variants interleaved
# (suite_rounds: Triton flat = default, Triton strided, CUDA C 4 a thread, CUDA C 1 a
# thread), cold first calls under both emitters, interleaved, and the gpu tests of both.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
HLOTK_CACHE_DIR=/tmp/hc_t timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu \
    tests/test_flat_loop.py tests/test_cuda_c.py > $OUT/t_gpu.log 2>&1
echo "gpu tests (flat, cuda_c) rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1; grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head
HLOTK_CACHE_DIR=/tmp/hc_z HLOTK_LOOP_EMITTER=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu \
    tests/test_cuda_runtime.py -k zoo_on_gpu > $OUT/zoo_cuda.log 2>&1
echo "zoo under cuda rc $?"; grep -E "passed|failed" $OUT/zoo_cuda.log | tail -1; grep -E "^FAILED" $OUT/zoo_cuda.log | head
HLOTK_CACHE_DIR=/tmp/hc_r timeout 200 python3 -m benchmarks.suite_rounds --only adam_step,giou --rounds 3 \
    --variant "strided:HLOTK_FLAT_LOOPS=0" --variant "cuda4:HLOTK_LOOP_EMITTER=cuda" \
    --variant "cuda1:HLOTK_LOOP_EMITTER=cuda,HLOTK_CUDA_C_PER_THREAD=1" --kernels adam_step,giou \
    --out $OUT/rounds.md > $OUT/rounds.log 2>&1
echo "suite_rounds rc $?"; grep "^|" $OUT/rounds.md | cut -c1-260 | head -30
MC=$(mktemp -d)
for v in cuda triton cuda triton; do
  timeout 90 python3 -m benchmarks.compile_time --autotune 1 --runs cold --machine-cache $MC \
     --only giou,adam_step --env HLOTK_LOOP_EMITTER=$v --tag " $v" --out $OUT/ct_$v.md > $OUT/ct_$v.log 2>&1
  echo "compile_time $v rc $?"; grep -E "^\| [a-z]" $OUT/ct_$v.md | cut -c1-330 | grep -v "^| program"
done

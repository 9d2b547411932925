#!/usr/bin/env bash
# Session 8: cold first calls after the CUDA C flat kernels, the fusion pre-pass and the
# CPU cuts, against XLA's lower+compile in the same child; the gpu tests of what changed.
# ${1:-.}: the tree to measure; ${2:-}: a second tree (before) run interleaved on adam_step.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu
A=${1:-.}; B=${2:-}
for t in $A $B; do (cd $t && timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1); done
(cd $A && XLA_PYTHON_CLIENT_PREALLOCATE=false HLOTK_CACHE_DIR=/tmp/hc_t PYTHONPATH=$PWD timeout 150 python3 -m pytest -q \
    -p no:cacheprovider -n 8 -m gpu tests/test_cuda_c.py tests/test_cuda_c_flat.py tests/test_flat_loop.py \
    tests/test_kernel_dedup.py tests/test_compile_cache.py tests/test_deferred_stores.py tests/test_fusion_chains.py \
    > /tmp/t_gpu.log 2>&1; echo "gpu tests rc $?"; grep -E "passed|failed" /tmp/t_gpu.log | tail -1; grep -E "^FAILED|^ERROR" /tmp/t_gpu.log | head)
MC=$(mktemp -d)
ct() {  # tree, programs, repeat, tag
  (cd $1 && PYTHONPATH=$PWD timeout 200 python3 -m benchmarks.compile_time --autotune 1 --runs cold --repeat $3 \
      --machine-cache $MC --only $2 --child-timeout 100 --out /tmp/ct_$4.md > /tmp/ct_$4.log 2>&1
   echo "== $4 rc $?"; grep -E "^\| [a-z]" /tmp/ct_$4.md | grep -v "^| program" | cut -d"|" -f2,3,7,8,9,10,11,15,20,21,22)
}
ct $A adam_step 2 a1
[ -n "$B" ] && ct $B adam_step 2 b1
ct $A adam_step,giou,softmax,layernorm 1 a2
[ -n "$B" ] && ct $B adam_step 1 b2
ct $A adam_step 1 a3
cat /tmp/ct_a*.md /tmp/ct_b*.md > $OUT/ct_all.md 2>/dev/null
cp /tmp/t_gpu.log $OUT/ 2>/dev/null

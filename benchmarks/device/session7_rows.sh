#!/usr/bin/env bash
# Session 7, call 3: row tiles at 16 elements per thread + level-1 pruning of heavier
# candidates, and the first call on the Python path. GPU tests of the native path, the
# runtime and the row templates; gpu_suite (device time) and cold first calls, this tree
# against .dev/before (HEAD), interleaved.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu
ROOT=$PWD
timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks .dev/before > /dev/null 2>&1
PYTHONPATH=$ROOT XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 \
    -m gpu tests/test_native_launcher.py tests/test_cuda_runtime.py tests/test_reduction_templates.py \
    tests/test_autotune.py > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head -10
for tree in after before; do
  d=$ROOT; [ $tree = before ] && d=$ROOT/.dev/before
  (cd $d && PYTHONPATH=$d HLOTK_CACHE_DIR=/tmp/hc_$tree timeout 200 python3 -m benchmarks.gpu_suite \
     --only softmax,layernorm,transformer,mlp_train --out $OUT/suite_$tree.md > $OUT/suite_$tree.log 2>&1)
  echo "suite $tree rc $?"; grep "^| [A-Za-z]" $OUT/suite_$tree.md | grep -v "^| program" | cut -d'|' -f2,4,5,6,7,8,12 | cut -c1-250
done
MC=$(mktemp -d)
for tree in after before after; do
  d=$ROOT; [ $tree = before ] && d=$ROOT/.dev/before
  (cd $d && PYTHONPATH=$d timeout 120 python3 -m benchmarks.compile_time --autotune 1 --runs cold \
     --machine-cache $MC --only softmax,layernorm,giou --out $OUT/ct_$tree.md > $OUT/ct_$tree.log 2>&1)
  echo "compile_time $tree rc $?"; grep -E "^\| [a-z]" $OUT/ct_$tree.md | cut -c1-330 | grep -v "^| program"
done

#!/usr/bin/env bash
# i13-generic, one call: flat loop kernels (codegen/triton/flat_loop.py) against main.
# Run from a folder holding copies of both trees, branch/ and main/ (the lead's checkout's
# .dev/i13-generic: `cd .dev/i13-generic && bash branch/benchmarks/device/i13_generic_run.sh`):
#   cold first call of adam_step and giou, main / branch / branch / main (compile_time,
#   autotune 1, one shared machine cache); adam_step's device time (gpu_suite) on both;
#   then the flat kernels' GPU tests. Each step gets what is left of a 300 s budget.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu
ROOT=$PWD
BUDGET=300
step() {          # step NAME MAX_SECONDS DIR command...: skipped when under 15 s are left
  local name=$1 max=$2 dir=$3; shift 3
  local left=$((BUDGET - SECONDS)); [ $left -lt $max ] && max=$left
  if [ $max -lt 15 ]; then echo "$name: skipped ($left s left)"; return; fi
  (cd $dir && PYTHONPATH=$dir timeout $max "$@")
  echo "$name rc $? at ${SECONDS}s"
}
timeout 30 python3 -m compileall -q -j 0 $ROOT/branch/{hlo,passes,codegen,runtime,benchmarks} \
    $ROOT/main/{hlo,passes,codegen,runtime,benchmarks} > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
MC=$(mktemp -d)
k=0
for tree in main branch branch main; do
  k=$((k + 1))
  step "compile_time $tree ($k)" 60 $ROOT/$tree python3 -m benchmarks.compile_time --autotune 1 \
      --runs cold --machine-cache $MC --only adam_step,giou --out $OUT/ct_${tree}_$k.md \
      > $OUT/ct_${tree}_$k.log 2>&1
  grep -E "^\| [a-z]" $OUT/ct_${tree}_$k.md 2>/dev/null | cut -c1-330
  grep -E "^POOL" $OUT/ct_${tree}_$k.log 2>/dev/null | cut -c1-260
done
for tree in branch main; do
  step "gpu_suite $tree" 60 $ROOT/$tree env HLOTK_CACHE_DIR=/tmp/hc_$tree python3 -m \
      benchmarks.gpu_suite --only adam_step --out $OUT/suite_$tree.md > $OUT/suite_$tree.log 2>&1
  grep "^| adam" $OUT/suite_$tree.md 2>/dev/null | cut -c1-300
done
step "gpu tests" 90 $ROOT/branch env XLA_PYTHON_CLIENT_PREALLOCATE=false \
    HLOTK_CACHE_DIR=/tmp/hc_tests python3 -m pytest -q -p no:cacheprovider -n 4 -m gpu \
    tests/test_flat_loop.py tests/test_kernel_dedup.py > $OUT/t_gpu.log 2>&1
grep -E "passed|failed" $OUT/t_gpu.log | tail -1; grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head
# one file back (the call returns at most 8)
(cd $OUT && tar -czf /tmp/i13g.tgz . && rm -f ./*.md ./*.json ./*.log && mv /tmp/i13g.tgz .)

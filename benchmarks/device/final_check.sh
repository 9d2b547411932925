#!/usr/bin/env bash
# Final validation of merged main (lead, third 2026-11-26 session), one device call:
# every gpu test, the zoo through the CUDA backend (native path coverage), the GPU suite,
# the GEMM-epilogue MLPs and jax.nn.dot_product_attention against XLA/cuDNN.
#   bash benchmarks/device/final_check.sh [part]    part: tests | bench | all (default)
set -u
OUT=${OUT:-/tmp}
PART=${1:-all}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
if [ "$PART" != bench ]; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 260 python3 -m pytest -q -p no:cacheprovider -n 4 \
      -m gpu tests/ > $OUT/t_gpu.log 2>&1
  echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
  grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head
  for i in 0 1 2 3; do
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python3 -m benchmarks.native_coverage \
        --shard $i/4 --jsonl $OUT/cov$i.jsonl > $OUT/cov$i.log 2>&1 &
  done
  wait
  python3 -m benchmarks.native_coverage --merge $OUT/cov*.jsonl --out $OUT/native_coverage.md \
      > $OUT/cov_merge.log 2>&1
  echo "zoo: $(grep -ciE '\| *yes *\|' $OUT/native_coverage.md) rows marked yes"; head -12 $OUT/native_coverage.md | cut -c1-200
fi
if [ "$PART" != tests ]; then
  timeout 200 python3 -m benchmarks.gpu_suite --out $OUT/gpu_suite.md > $OUT/suite.log 2>&1
  echo "gpu_suite rc $?"; grep "^|" $OUT/gpu_suite.md | cut -f1-6,11 -d'|' | cut -c1-200
  timeout 120 python3 -m benchmarks.gemm_epilogues --out $OUT/gemm_epilogues.md > $OUT/epi.log 2>&1
  echo "gemm_epilogues rc $?"; grep "^|" $OUT/gemm_epilogues.md | cut -c1-260
  timeout 150 python3 -m benchmarks.attention --only dpa > $OUT/dpa.log 2>&1
  echo "dpa rc $?"; grep -v "^ \|Warn\|warn" $OUT/dpa.log | tail -12 | cut -c1-200
fi

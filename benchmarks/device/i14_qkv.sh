#!/usr/bin/env bash
# i14-qkv (dot-merger): gpu tests of the touched files + test_fusion_attention, the suite's
# transformer against XLA, one call's kernel sequence with and without the pass, and the
# two programs with a q/k/v projection outside the suite (one call, ~340 s).
#   bash benchmarks/device/i14_qkv.sh
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 25 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
HLOTK_AUTOTUNE=0 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 95 python3 -m pytest -q -p no:cacheprovider -n 4 \
    -m gpu tests/test_dot_merger.py tests/test_fusion_attention.py > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head
timeout 75 python3 -m benchmarks.gpu_suite --only transformer --out $OUT/gpu_suite.md \
    > $OUT/suite.log 2>&1
echo "suite rc $?"; grep -E "^ceilings|^\| transformer" $OUT/suite.log | cut -c1-400
timeout 70 python3 -m benchmarks.dot_merger_gpu --seq --out $OUT > $OUT/seq.log 2>&1
echo "seq rc $?"; grep -v "arn" $OUT/seq.log | cut -c1-160 | tail -60
timeout 85 python3 -m benchmarks.dot_merger_gpu --programs --out $OUT > $OUT/programs.log 2>&1
echo "programs rc $?"; grep -v "arn" $OUT/programs.log | tail -12

#!/usr/bin/env bash
# Session 8: adam_step's device time (graph replays, L2 flushed) with CUDA C flat kernels
# taking 1, 2 or 4 chunks a thread a grid apart, against Triton's flat kernels; gpu tests.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
timeout 200 python3 -m benchmarks.emitter_ab --only adam_step --rounds 7 \
    --sides "auto;triton;v2:HLOTK_CUDA_C_FLAT_VECTORS=2;v4:HLOTK_CUDA_C_FLAT_VECTORS=4;v2t128:HLOTK_CUDA_C_FLAT_VECTORS=2,HLOTK_CUDA_C_FLAT_LAUNCH=128" 2>&1 | grep -E "^\{|Error" | tail -3
for v in 2 4; do
HLOTK_CUDA_C_FLAT_VECTORS=$v XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_cuda_c_flat.py tests/test_cuda_c.py > /tmp/tv.log 2>&1; echo "gpu tests V=$v rc $?"; grep -E "passed|failed" /tmp/tv.log | tail -1
done

#!/usr/bin/env bash
# i13-flat-sass: the CUDA C flat kernels' division and square root (codegen/cuda_c/flat.py,
# HLOTK_CUDA_C_FLAT_DIVSQRT) on adam_step's graph replays (L2 flushed) against Triton's,
# the update kernel alone per mode, the gpu tests, and a short ncu read of one kernel.
set -u
OUT=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache \
    XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 15 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
timeout -k 5 150 python3 -m benchmarks.emitter_ab --only adam_step --rounds 7 \
    --sides "auto;ieee:HLOTK_CUDA_C_FLAT_DIVSQRT=ieee;triton;approx:HLOTK_CUDA_C_FLAT_DIVSQRT=approx;c32:HLOTK_CUDA_C_FLAT_CHUNK=32" \
    > $OUT/emitter_ab.log 2>&1; echo "emitter_ab rc $?"
grep -E "^\{" $OUT/emitter_ab.log | tail -1; grep -E "Error|error" $OUT/emitter_ab.log | tail -3
timeout -k 5 40 python3 -m benchmarks.flat_divsqrt > $OUT/flat_divsqrt.log 2>&1; echo "flat_divsqrt rc $?"
grep -E "^\||Error" $OUT/flat_divsqrt.log | tail -12
timeout -k 5 70 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_c_flat.py \
    tests/test_cuda_c.py > $OUT/gpu_tests.log 2>&1; echo "gpu tests rc $?"
grep -E "passed|failed|Error" $OUT/gpu_tests.log | tail -4
timeout -k 5 35 ncu --clock-control none --kernel-name regex:fused --launch-count 6 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats \
    python3 -m benchmarks.flat_divsqrt --ncu --modes ieee,chunk > $OUT/ncu.log 2>&1; echo "ncu rc $?"
grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Memory Throughput|==PROF==|==ERROR==" $OUT/ncu.log | head -40

#!/usr/bin/env bash
# i13-flat-sass, NOT RUN yet (for the next call): adam_step's graph replays, L2 flushed, on
# staging buffers of real-looking data (emitter_ab --staging random) and on the launcher's
# zeros, by HLOTK_CUDA_C_FLAT_DIVSQRT mode (ieee: the default; chunk now takes zeros on its
# fast paths) against Triton's flat kernels; then the gpu tests of the flat kernels.
set -u
OUT=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache \
    XLA_PYTHON_CLIENT_PREALLOCATE=false
SIDES="auto;chunk:HLOTK_CUDA_C_FLAT_DIVSQRT=chunk;approx:HLOTK_CUDA_C_FLAT_DIVSQRT=approx;triton"
timeout 15 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
for staging in random zeros; do
  timeout -k 5 120 python3 -m benchmarks.emitter_ab --only adam_step --rounds 7 --staging $staging \
      --sides "$SIDES" > $OUT/emitter_ab_$staging.log 2>&1; echo "emitter_ab $staging rc $?"
  grep -E "^\{" $OUT/emitter_ab_$staging.log | tail -1; grep -E "Error" $OUT/emitter_ab_$staging.log | tail -3
done
timeout -k 5 70 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_c_flat.py \
    tests/test_cuda_c.py > $OUT/gpu_tests.log 2>&1; echo "gpu tests rc $?"
grep -E "passed|failed|Error" $OUT/gpu_tests.log | tail -4

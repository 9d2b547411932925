#!/usr/bin/env bash
# Lead, sixth session, seventh call: counted loops (lax.scan) inside the program's graph:
# the CUDA runtime's GPU tests (graphs vs eager bitwise, scan_rnn among them) and the LSTM
# gradient beside XLA.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 30 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 \
    -m gpu tests/test_cuda_runtime.py tests/test_trip_count.py tests/test_native_launcher.py \
    > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head -10
timeout 200 python3 -m benchmarks.gpu_suite --heldout --only lstm_grad \
    --out $OUT/heldout.md > $OUT/heldout.log 2>&1
echo "heldout rc $?"; grep "^|" $OUT/heldout.md | cut -c1-420
grep -E "host path:|^jit_" $OUT/heldout.md | cut -c1-300
grep -E "Error|Traceback" $OUT/heldout.log | head -5 | cut -c1-300

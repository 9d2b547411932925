#!/usr/bin/env bash
# Lead, sixth session: loops after in-place state updates and no DUS sibling fusion: the
# gpu tests of the runtime, buffer assignment and held-out programs; the LSTM per kernel.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 \
    -m gpu tests/test_cuda_runtime.py tests/test_cuda_torch_ops.py tests/test_native_launcher.py \
    tests/test_buffer_assignment.py tests/test_heldout_programs.py > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head -10
timeout 120 python3 -m benchmarks.gpu_suite --heldout --only lstm_grad,gpt_train_step \
    --out $OUT/heldout.md > $OUT/heldout.log 2>&1
echo "heldout rc $?"; grep "^|" $OUT/heldout.md | cut -c1-330
timeout 120 python3 benchmarks/device/session6_probe.py lstm 2>&1 | grep -v arn | tail -17

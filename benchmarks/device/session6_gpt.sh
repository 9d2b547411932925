#!/usr/bin/env bash
# Lead, sixth session, third call: the GPT step's native path (a capture-local memset kept
# as captured), its timing beside XLA, the shared-mask GPU tests at full f32 precision.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 30 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 120 python3 -m pytest -q -p no:cacheprovider -x \
    -m gpu tests/test_attention_variants.py -k sharing tests/test_native_launcher.py \
    > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^E |^FAILED|Error" $OUT/t_gpu.log | head -20
timeout 100 python3 benchmarks/device/gpt_native_diag.py small 2>&1 | grep -v arn | tail -6
timeout 150 python3 -m benchmarks.gpu_suite --heldout --only gpt_train_step \
    --out $OUT/heldout.md > $OUT/heldout.log 2>&1
echo "heldout rc $?"; grep "^|" $OUT/heldout.md | cut -c1-420
grep -A3 "host path:" $OUT/heldout.md | head -8 | cut -c1-300

#!/usr/bin/env bash
# Final validation of merged main (lead, fifth 2026-11-26 session), one device call: every
# gpu test; gpu_suite (all suite programs, same process as XLA); the held-out decoder block
# and RMSNorm+SwiGLU; issue 14's long causal attention, cross-entropy and training step
# (benchmarks/attention.py); adam_step / softmax cold first call.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout ${TEST_S:-170} python3 -m pytest -q -p no:cacheprovider \
    -n ${WORKERS:-8} -m gpu tests/ > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head -20
timeout ${SUITE_S:-150} python3 -m benchmarks.gpu_suite --out $OUT/gpu_suite.md > $OUT/suite.log 2>&1
echo "gpu_suite rc $?"; grep "^|" $OUT/gpu_suite.md | cut -c1-200
timeout ${HELD_S:-60} python3 -m benchmarks.gpu_suite --heldout --only llama_block,rmsnorm_swiglu \
    --out $OUT/heldout.md > $OUT/heldout.log 2>&1
echo "heldout rc $?"; grep "^|" $OUT/heldout.md | cut -c1-200
grep -A14 "^jit_rmsnorm_swiglu" $OUT/heldout.md | grep -E "ms  " | cut -c1-120
timeout ${ATT_S:-110} python3 -m benchmarks.attention --only xent,suite \
    --programs attn_fwd,transformer_train > $OUT/attention.log 2>&1
echo "attention rc $?"; grep -v "^ \|^[0-9. ]*ms \|arn" $OUT/attention.log | tail -14 | cut -c1-250
timeout ${CT_S:-60} python3 -m benchmarks.compile_time --autotune 1 --only softmax,adam_step \
    --out $OUT/ct.md > $OUT/ct.log 2>&1
echo "compile_time rc $?"; grep "^|" $OUT/ct.md | cut -c1-330

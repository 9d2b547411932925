#!/usr/bin/env bash
# Final validation, call B: issue 14's programs (long causal attention, cross-entropy,
# training step), the held-out programs this session found and fixed, and the cold first
# call of the small suite programs (issue 13) after i13-cpu.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 \
    -m gpu tests/test_cuda_runtime.py tests/test_cuda_torch_ops.py > $OUT/t_gpu.log 2>&1
echo "gpu tests (cuda runtime, torch ops) rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head -10
timeout 120 python3 -m benchmarks.attention --only xent,suite \
    --programs attn_fwd,transformer_train > $OUT/attention.log 2>&1
echo "attention rc $?"; grep -v "^ \|^[0-9. ]*ms \|arn" $OUT/attention.log | tail -14 | cut -c1-250
timeout 200 python3 -m benchmarks.gpu_suite --heldout \
    --only lstm_grad,gpt_train_step,moe_grad,conv_bn_grad,kv_decode,llama_block \
    --out $OUT/heldout.md > $OUT/heldout.log 2>&1
echo "heldout rc $?"; grep "^|" $OUT/heldout.md | cut -c1-330
grep -E "host path:" $OUT/heldout.md | cut -c1-200
MC=$(mktemp -d)
timeout 150 python3 -m benchmarks.compile_time --autotune 1 --runs cold --machine-cache $MC \
    --only adam_step,softmax,layernorm,giou --out $OUT/ct.md > $OUT/ct.log 2>&1
echo "compile_time rc $?"; grep -E "^\| [a-z]" $OUT/ct.md | cut -c1-330

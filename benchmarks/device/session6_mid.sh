#!/usr/bin/env bash
# Lead, sixth 2026-11-26 session, second call: the shared-mask attention fix, the one-hot
# scatter and the recompute rule on the GPU (gpu tests of the files they touch), the new
# held-out GPT training step and the cross-entropy gradient beside XLA, the suite programs
# whose fusion changed (transformer_train) or could (mlp_train), and adam_step's cold
# first call with the pool's longest-first order.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 30 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python3 -m pytest -q -p no:cacheprovider -n 4 \
    -m gpu tests/test_attention_variants.py tests/test_gemm_epilogue.py \
    tests/test_reduction_templates.py tests/test_gather_triton.py tests/test_fusion_attention.py \
    > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head -20
timeout 170 python3 -m benchmarks.gpu_suite --heldout --only gpt_train_step,xent_32k \
    --out $OUT/heldout.md > $OUT/heldout.log 2>&1
echo "heldout rc $?"; grep "^|" $OUT/heldout.md | cut -c1-300; tail -3 $OUT/heldout.log | cut -c1-300
timeout 110 python3 -m benchmarks.attention --only xent,suite --programs transformer_train \
    --out $OUT/attn.md > $OUT/attn.log 2>&1
echo "attention rc $?"; grep "^|" $OUT/attn.md | cut -c1-300
timeout 100 python3 -m benchmarks.gpu_suite --only transformer,mlp_train --out $OUT/suite.md \
    > $OUT/suite.log 2>&1
echo "gpu_suite rc $?"; grep "^|" $OUT/suite.md | cut -c1-260
MC=$(mktemp -d)
timeout 60 python3 -m benchmarks.compile_time --autotune 1 --runs cold --machine-cache $MC \
    --only adam_step --out $OUT/ct.md > $OUT/ct.log 2>&1
echo "compile_time rc $?"; grep -E "^\| [a-z]|^POOL" $OUT/ct.log | cut -c1-400

#!/usr/bin/env bash
# Lead, fifth 2026-11-26 session: the two changes of the morning on the GPU. GEMM fusions
# split to cuBLAS + epilogue where the Triton template's rate loses (SwiGLU gate/up), and
# K/V heads repeated with jnp.repeat read in place by the flash kernel; their gpu tests,
# then the held-out decoder block and RMSNorm+SwiGLU against jax.jit.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 100 python3 -m pytest -q -p no:cacheprovider -n 4 \
    -m gpu tests/test_split_gemm.py tests/test_fusion_attention.py tests/test_gemm_epilogue.py \
    > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR|^E  " $OUT/t_gpu.log | head -20
timeout ${SUITE_S:-120} python3 -m benchmarks.gpu_suite --heldout \
    --only ${ONLY:-llama_block,rmsnorm_swiglu} --out $OUT/heldout.md > $OUT/heldout.log 2>&1
echo "heldout rc $?"; grep "^|" $OUT/heldout.md | cut -c1-330
grep -A12 "^jit_rmsnorm_swiglu\|^jit_llama_block" $OUT/heldout.md | grep -E "ms  |host path|jit_" | cut -c1-160

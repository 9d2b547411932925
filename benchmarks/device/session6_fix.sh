#!/usr/bin/env bash
# Lead, sixth session, fifth call: the fixes the held-out programs led to (MoE GEMM
# prologue relayouts, weight-gradient conv layouts, decode-shaped attention), their GPU
# tests, and the three programs beside XLA again.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 30 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 \
    -m gpu tests/test_cudnn_conv.py tests/test_gemm_epilogue.py tests/test_split_gemm.py \
    tests/test_heldout_programs.py tests/test_cuda_torch_ops.py > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head -10
timeout 240 python3 -m benchmarks.gpu_suite --heldout --only moe_grad,conv_bn_grad,kv_decode \
    --out $OUT/heldout.md > $OUT/heldout.log 2>&1
echo "heldout rc $?"; grep "^|" $OUT/heldout.md | cut -c1-420
for p in jit_moe_grad jit_conv_bn_grad jit_kv_decode; do echo "== $p"
  awk "/^$p/,/^\`\`\`\$/" $OUT/heldout.md | grep "ms  " | sort -rn | head -8; done

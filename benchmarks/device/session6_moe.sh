#!/usr/bin/env bash
# Lead, sixth session, sixth call: the small-dim tiled transposes and the GEMM relayout
# rules on the MoE gradient; their GPU tests.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 30 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 100 python3 -m pytest -q -p no:cacheprovider -n 4 \
    tests/test_triton_transpose.py tests/test_layout.py -m "gpu or not gpu" -k "transpose" \
    > $OUT/t_gpu.log 2>&1
echo "transpose tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head -10
timeout 150 python3 -m benchmarks.gpu_suite --heldout --only moe_grad \
    --out $OUT/heldout.md > $OUT/heldout.log 2>&1
echo "heldout rc $?"; grep "^|" $OUT/heldout.md | cut -c1-420
awk "/^jit_moe_grad/,/^\`\`\`\$/" $OUT/heldout.md | grep "ms  " | sort -rn | head -12

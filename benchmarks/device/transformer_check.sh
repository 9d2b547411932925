#!/usr/bin/env bash
# Lead, third 2026-11-26 session: the attention output layout and the GELU epilogue on the
# GPU (gpu tests of the touched files, gpu_suite transformer/mlp_train, per-kernel CUPTI).
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python3 -m pytest -q -p no:cacheprovider -n 3 \
    -m gpu tests/test_gemm_epilogue.py tests/test_fusion_attention.py tests/test_split_gemm.py \
    > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head
timeout 120 python3 -m benchmarks.gpu_suite --only transformer,mlp_train --out $OUT/gpu_suite.md \
    > $OUT/suite.log 2>&1
echo "gpu_suite rc $?"; grep "^|" $OUT/gpu_suite.md | cut -c1-330
grep -A16 "^jit_transformer" $OUT/gpu_suite.md | grep -v "^stats\|python path"
timeout 120 python3 -c "
from benchmarks.gpu_suite import programs
from benchmarks.kernel_profile import kernel_table, format_table
p = [p for p in programs() if p[0] == 'transformer'][0]
print(format_table(kernel_table(p[2], p[3], steps=10, xla=False)))
" > $OUT/kernels.log 2>&1
echo "kernels rc $?"; grep -v "arn" $OUT/kernels.log | tail -14

#!/usr/bin/env bash
# Start of the fifth 2026-11-26 session (lead), one device call: the in-place residual GEMM
# landed unverified last session (gpu test + the transformer's kernel sequence), cuBLAS's
# heuristic vs cuBLASLt vs TunableOp vs XLA per transformer GEMM shape, the cold first call
# of adam_step and softmax after i13-passes, and gpu_suite's transformer and mlp_train.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 80 python3 -m pytest -q -p no:cacheprovider \
    -n 4 -m gpu tests/test_gemm_epilogue.py > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head -20
timeout 40 python3 - > $OUT/seq.log 2>&1 <<'PY'
from benchmarks.gpu_suite import programs
from benchmarks.kernel_profile import kernel_table, format_sequence
p = [p for p in programs() if p[0] == "transformer"][0]
r = kernel_table(p[2], p[3], steps=6, xla=False)["hlotk"]
names = {k["name"]: k["thunks"] for k in r["kernels"] if k["thunks"]}
print(f"== transformer: sum {r['sum_us']:.1f} span {r['span_us']:.1f} launches {r['launches']:.0f}")
print(format_sequence(r["sequence"], names))
PY
echo "seq rc $?"; grep -v "arn" $OUT/seq.log | cut -c1-180 | tail -16
timeout 70 python3 -m benchmarks.gemm_algo_probe --out $OUT/gemm_algo.md > $OUT/gemm_algo.log 2>&1
echo "gemm_algo rc $?"; grep "^|" $OUT/gemm_algo.md; tail -3 $OUT/gemm_algo.log | cut -c1-300
timeout 100 python3 -m benchmarks.compile_time --autotune 1 --only softmax,adam_step \
    --out $OUT/ct.md > $OUT/ct.log 2>&1
echo "compile_time rc $?"; grep "^|" $OUT/ct.md | cut -c1-400
timeout 80 python3 -m benchmarks.gpu_suite --only transformer,mlp_train --out $OUT/gpu_suite.md \
    > $OUT/suite.log 2>&1
echo "gpu_suite rc $?"; grep "^|" $OUT/gpu_suite.md | cut -c1-260

#!/usr/bin/env bash
# Final validation of merged main (lead, fourth 2026-11-26 session), one device call:
# every gpu test, then gpu_suite's transformer and mlp_train against XLA (the residual
# epilogue, the dot merger), softmax/adam cold first call, and the graph-launch probe.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout ${TEST_S:-200} python3 -m pytest -q -p no:cacheprovider \
    -n ${WORKERS:-8} -m gpu tests/ > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head -20
timeout ${SUITE_S:-80} python3 -m benchmarks.gpu_suite --only transformer,mlp_train --out $OUT/gpu_suite.md \
    > $OUT/suite.log 2>&1
echo "gpu_suite rc $?"; grep "^|" $OUT/gpu_suite.md | cut -c1-260
timeout ${SEQ_S:-40} python3 - > $OUT/seq.log 2>&1 <<'PY'
from benchmarks.gpu_suite import programs
from benchmarks.kernel_profile import kernel_table, format_sequence
p = [p for p in programs() if p[0] == "transformer"][0]
r = kernel_table(p[2], p[3], steps=6, xla=False)["hlotk"]
names = {k["name"]: k["thunks"] for k in r["kernels"] if k["thunks"]}
print(f"== transformer: sum {r['sum_us']:.1f} span {r['span_us']:.1f} launches {r['launches']:.0f}")
print(format_sequence(r["sequence"], names))
PY
echo "seq rc $?"; grep -v "arn" $OUT/seq.log | cut -c1-180 | tail -16
timeout ${PROBE_S:-30} python3 -m benchmarks.graph_launch_probe --out $OUT/probe.md > $OUT/probe.log 2>&1
echo "probe rc $?"; grep "^|" $OUT/probe.log | tail -16

#!/usr/bin/env bash
# Lead, fourth 2026-11-26 session, first device call: every gpu test (the merged_band move
# was interpreter-tested only), then one call's kernel sequence with the idle gap before
# each kernel for mlp_train and transformer, hlotk and XLA (where the span exceeds the sum).
#   bash benchmarks/device/start_check.sh [tests|seq|all]
set -u
OUT=${OUT:-/tmp}
PART=${1:-all}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
if [ "$PART" != seq ]; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 280 python3 -m pytest -q -p no:cacheprovider -n 4 \
      -m gpu tests/ > $OUT/t_gpu.log 2>&1
  echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
  grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head
fi
if [ "$PART" != tests ]; then
  timeout 200 python3 - > $OUT/seq.log 2>&1 <<'PY'
from benchmarks.gpu_suite import programs
from benchmarks.kernel_profile import kernel_table, format_sequence
for name in ("mlp_train", "transformer"):
    p = [p for p in programs() if p[0] == name][0]
    res = kernel_table(p[2], p[3], steps=6)
    for tag in ("hlotk", "xla"):
        r = res[tag]
        names = {k["name"]: k["thunks"] for k in r["kernels"] if k["thunks"]}
        print(f"== {name} {tag}: sum {r['sum_us']:.1f} span {r['span_us']:.1f} launches {r['launches']:.0f}")
        print(format_sequence(r["sequence"], names))
PY
  echo "seq rc $?"; grep -v "arn" $OUT/seq.log | cut -c1-200 | tail -150
fi

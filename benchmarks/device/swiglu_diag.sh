#!/usr/bin/env bash
# Lead: why the device's fusion of RMSNorm+SwiGLU differs from the deviceless one.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache_diag
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu -x \
    "tests/test_split_gemm.py::test_gpu_swiglu_projections_run_as_cublas_plus_epilogue_kernels" \
    > $OUT/t.log 2>&1; echo "test rc $?"; grep -E "^E |assert" $OUT/t.log | head -12 | cut -c1-300
timeout 90 python3 - > $OUT/diag.log 2>&1 <<'PY'
import jax, runtime
from benchmarks.heldout_programs import programs
from passes.fusion import report_for
from runtime.cuda import executable_of
p = [p for p in programs() if p[0] == "rmsnorm_swiglu"][0]
dev = jax.device_put(p[3])
low = runtime.jit(p[2], backend="cuda").lower(*dev)
print("LOWERED:\n" + low.module.to_text()[:6000])
c = low.compile()
print("FUSED:\n" + c.as_text()[-5000:])
r = report_for(c.module)
for d in (r.decisions if r else []):
    if "dot" in d.producer or "dot" in d.consumer:
        print(d.producer, "->", d.consumer, d.fused, d.action, d.reason[:120], round(d.unfused_us, 1), round(d.fused_us, 1))
exe = executable_of(c)
print(exe.target, exe.stats.get("library_gemms"))
PY
echo "diag rc $?"; grep -v "arn" $OUT/diag.log | grep -E "dot|fusion\b|kind=|->|h200|LOWERED|FUSED" | cut -c1-260 | head -60

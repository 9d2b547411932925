#!/usr/bin/env bash
# Lead, fifth 2026-11-26 session: held-out programs on the GPU against jax.jit (gpu_suite
# --heldout), and the LLaMA-style block's kernel sequence (where its device time goes).
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
timeout ${SUITE_S:-150} python3 -m benchmarks.gpu_suite --heldout \
    --only ${ONLY:-llama_block,rmsnorm_swiglu,dpa_grad} --out $OUT/heldout.md > $OUT/heldout.log 2>&1
echo "heldout rc $?"; grep "^|" $OUT/heldout.md | cut -c1-330
grep -E "Error|error" $OUT/heldout.log | head -5
timeout ${SEQ_S:-60} python3 - > $OUT/seq.log 2>&1 <<'PY'
from benchmarks.heldout_programs import programs
from benchmarks.kernel_profile import kernel_table, format_sequence
p = [p for p in programs() if p[0] == "llama_block"][0]
res = kernel_table(p[2], p[3], steps=6, xla=True)
for who in ("hlotk", "xla"):
    r = res[who]
    names = {k["name"]: k.get("thunks") for k in r["kernels"] if k.get("thunks")}
    print(f"== llama_block {who}: sum {r['sum_us']:.1f} span {r['span_us']:.1f} launches {r['launches']:.0f}")
    print(format_sequence(r["sequence"], names))
PY
echo "seq rc $?"; grep -v "arn" $OUT/seq.log | cut -c1-160 | tail -60

#!/usr/bin/env bash
# Lead, fourth 2026-11-26 session: why mlp_train's first GEMM starts 46 µs after a memset
# (start_check.sh seq): XLA's wrapper HLO, the native graph's nodes, the graph replayed
# alone under CUPTI, and call_timeline (time to first kernel, handler, ready lag) for
# mlp_train and transformer, hlotk and jax.jit.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
timeout 150 python3 - > $OUT/replay.log 2>&1 <<'PY'
import jax, runtime
from benchmarks.gpu_suite import programs
from benchmarks.kernel_profile import _trace_kernels, call_sequence, format_sequence
from benchmarks.call_timeline import wrapper_text
from runtime.cuda import executable_of
for name in ("mlp_train", "transformer"):
    p = [p for p in programs() if p[0] == name][0]
    dev = jax.device_put(p[3]); jax.block_until_ready(dev)
    hc = runtime.jit(p[2], backend="cuda").lower(*dev).compile()
    for _ in range(3):
        jax.block_until_ready(hc(*dev))
    exe = executable_of(hc)
    g = exe.native
    print(f"== {name}: {g.describe()}")
    print("nodes:", [n.kind for n in g.nodes][:40])
    wrapper_text(name, hc, dev)
    replay = g.replay_on_staging()
    import torch
    recs = _trace_kernels(lambda: (replay(), torch.cuda.synchronize()), 6)
    print(f"-- {name}: graph replayed alone")
    print(format_sequence(call_sequence(recs)))
PY
echo "replay rc $?"; grep -v "arn" $OUT/replay.log | cut -c1-220 | tail -80
for f in $OUT/wrapper_*.txt; do echo "== $f"; grep -v "^ *$" $f | head -30 | cut -c1-250; done
timeout 240 python3 -m benchmarks.call_timeline --only mlp_train,transformer --reps 30 --rounds 3 \
    --profile --out $OUT/call_timeline.md > $OUT/ct.log 2>&1
echo "call_timeline rc $?"; cat $OUT/call_timeline.md | cut -c1-200

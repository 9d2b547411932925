#!/usr/bin/env bash
# Issue 17's several-GPU run in one device call: benchmarks.spmd_gpu (hlotk vs jax.jit on the
# same GPUs), then tests/test_spmd_multiprocess.py (NCCL, CUDA IPC, async collectives), every
# step under a watchdog so that a hung NCCL collective cannot use up the call.
#
#   bash benchmarks/spmd_gpu_run.sh [total seconds, default 320]
#
# Results under $OUT (default ./spmd_gpu_out): spmd_gpu.md (collectives captured in CUDA
# graphs), spmd_gpu_nocapture.md (a rerun, with HLOTK_CAPTURE_COLLECTIVES=0, of the programs
# that failed or did not finish with capture), bench*.log, tests.log, traces.tar.gz.
# SPMD_GPU_DRY=1 runs the same steps on the CPU (gloo workers, Triton's interpreter, --small
# shapes, 2 host devices): a check of the script itself.
set -u
TOTAL=${1:-320}
START=$SECONDS
OUT=${OUT:-$PWD/spmd_gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false HLOTK_MESH_TIMEOUT_S=75
export HLOTK_CACHE_DIR=${HLOTK_CACHE_DIR:-/tmp/hlotk_cache}
PY=${PY:-python3}
BENCH_ARGS=()
if [ "${SPMD_GPU_DRY:-0}" = 1 ]; then
    export JAX_PLATFORMS=cpu TRITON_INTERPRET=1 XLA_FLAGS=--xla_force_host_platform_device_count=2
    BENCH_ARGS=(--small --reps 3)
else
    export JAX_PLATFORMS=cuda,cpu
    nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader
fi
PROGRAMS="megatron_mlp dp_train_step seq_sharded_reduce transformer_block_2d"

left() { echo $(( TOTAL - (SECONDS - START) )); }

# A step's processes (the benchmark, its GPU workers) share timeout's process group: on
# expiry all get SIGTERM, then SIGKILL 5 s later.
step() {  # step NAME SECONDS LOG COMMAND...
    local name=$1 secs=$2 log=$3; shift 3
    echo "== $name: up to ${secs}s (t=$((SECONDS - START))s)"
    timeout -k 5 "$secs" "$@" > "$log" 2>&1
    local rc=$?
    echo "== $name: rc $rc after $((SECONDS - START))s$([ $rc = 124 ] && echo ' (watchdog)')"
    leftovers
    return $rc
}

leftovers() {  # GPU processes a killed step left behind (only ours run on this machine)
    command -v nvidia-smi > /dev/null || return 0
    local pids
    pids=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ')
    [ -n "$pids" ] && { echo "killing leftover GPU processes: $pids"; kill -9 $pids 2>/dev/null; sleep 2; }
    return 0
}

# 1. all four programs, collectives captured (the default), trace of the dp step and the block.
step "bench (capture)" $(( $(left) - 120 < 185 ? $(left) - 120 : 185 )) "$OUT/bench.log" \
    $PY -m benchmarks.spmd_gpu --devices 2 "${BENCH_ARGS[@]}" --out "$OUT/spmd_gpu.md" \
    --trace-dir "$OUT/traces"
grep -E "^[a-z_0-9]+ (bf16|f32): hlotk" "$OUT/bench.log"

# 2. the programs that did not finish: again without collectives in CUDA graphs.
redo=""
for p in $PROGRAMS; do
    grep -qE "^$p [a-z0-9]+: hlotk" "$OUT/bench.log" || redo="$redo,$p"
done
redo=${redo#,}
if [ -n "$redo" ]; then
    grep -E "Error|error|capture failed" "$OUT/bench.log" | tail -8
    secs=$(( $(left) - 90 ))
    if [ $secs -ge 40 ]; then
        HLOTK_CAPTURE_COLLECTIVES=0 step "bench without capture ($redo)" $secs \
            "$OUT/bench_nocapture.log" $PY -m benchmarks.spmd_gpu --devices 2 \
            "${BENCH_ARGS[@]}" --only "$redo" --out "$OUT/spmd_gpu_nocapture.md" \
            --trace-dir "$OUT/traces_nocapture"
        grep -E "^[a-z_0-9]+ (bf16|f32): hlotk" "$OUT/bench_nocapture.log"
    else
        echo "no time left to rerun $redo without capture"
    fi
fi

# 3. the multi-process tests (NCCL between the two GPUs, CUDA IPC of sharded jax.Arrays).
secs=$(( $(left) - 8 ))
if [ $secs -ge 20 ]; then
    # conftest gives JAX its 8 host devices unless XLA_FLAGS already names a count
    step "tests" $secs "$OUT/tests.log" env -u XLA_FLAGS $PY -m pytest -q -p no:cacheprovider --tb=short -rfEs \
        --durations=5 tests/test_spmd_multiprocess.py
    grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/tests.log" | tail -15
else
    echo "no time left for the tests"
fi

tar -czf "$OUT/traces.tar.gz" -C "$OUT" $(cd "$OUT" && ls -d traces* 2>/dev/null | grep -v tar.gz) 2>/dev/null \
    && rm -rf "$OUT"/traces "$OUT"/traces_nocapture
echo "== done at $((SECONDS - START))s"
for f in "$OUT"/spmd_gpu*.md; do
    [ -f "$f" ] && { echo "--- $(basename "$f")"; grep -E "^\| |^Communication|^- " "$f" | cut -c1-400; }
done

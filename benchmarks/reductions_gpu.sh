#!/bin/bash
# Issue 14's reductions on the GPU machine, one call: the gpu tests of the reduction work,
# then benchmarks/reductions.py (suite + issue 14 with the legacy templates beside; the zoo
# without), merged into $OUT/reductions.md. Each step has its own timeout.
set -u
export PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false \
       HLOTK_CACHE_DIR=/tmp/hlotk_cache PYTHONUNBUFFERED=1 HLOTK_AUTOTUNE=0
O=${OUT:-/tmp/reductions_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
T0=$SECONDS
# every test of the reduction templates runs for real here (no interpreter on a GPU)
timeout ${T_TESTS:-90} python3 -m pytest -q -p no:cacheprovider tests/test_reduction_templates.py \
    > "$O/tests.log" 2>&1
echo "tests rc=$? $((SECONDS - T0)) s"; tail -4 "$O/tests.log"
timeout ${T_RED:-190} python3 -m benchmarks.reductions --only suite,issue14 --jsonl "$O/red.jsonl" \
    > "$O/red.log" 2>&1
echo "reductions rc=$? $((SECONDS - T0)) s"; grep "^#" "$O/red.log" | tail -20
timeout ${T_ZOO:-75} python3 -m benchmarks.reductions --only zoo --no-legacy --jsonl "$O/zoo.jsonl" \
    > "$O/zoo.log" 2>&1
echo "zoo rc=$? $((SECONDS - T0)) s"
python3 -m benchmarks.reductions --merge "$O/red.jsonl" "$O/zoo.jsonl" --out "$O/reductions.md" \
    | grep -v "| zoo |" | cut -c1-260

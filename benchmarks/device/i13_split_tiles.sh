#!/usr/bin/env bash
# i13-split-tiles, one device call (run from the lead's checkout root; the branch under
# .dev/i13-split-tiles): conv_bn_grad's split-partials tiles sized by lane accumulators.
# 1. device time, interleaved A/B in one process (graph replays on the call's own arguments):
#    off (HLOTK_SPLIT_ACC_REGISTERS=0: 64x128 w8), r64 (64x64 w8, the default when this
#    ran), r32 (64x32 w8, the default after it), 7 rounds, wall ms of each call and XLA's;
# 2. cold first call (compile_time --autotune 1 --runs cold, XLA in the same child): off, r64;
# 3. each BN-partials tile alone (compile s, regs/spills, eager and graph-replay us);
# 4. test_column_tiles.py on the GPU; 5. more cold rows if the time allows.
set -u
OUT=${OUT:-/tmp}
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false
cd .dev/i13-split-tiles
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
timeout 30 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
MC=$(mktemp -d)
# 1. device time A/B
HLOTK_AUTOTUNE=1 HLOTK_CACHE_DIR=/tmp/hlotk_ab timeout 110 python3 -m benchmarks.emitter_ab \
    --only conv_bn_grad --rounds 7 --wall --show split_partials \
    --sides "off:HLOTK_SPLIT_ACC_REGISTERS=0;r64:HLOTK_SPLIT_ACC_REGISTERS=64;r32:HLOTK_SPLIT_ACC_REGISTERS=32" \
    > $OUT/ab.log 2>&1; echo "== ab rc $?"
grep -E '^\{' $OUT/ab.log | cut -c1-900; grep -E "Error|Traceback" $OUT/ab.log | head -5
# 2. cold first call
ct() {  # tag, env
  timeout 58 python3 -m benchmarks.compile_time --autotune 1 --machine-cache $MC --runs cold \
      --child-timeout 52 --only conv_bn_grad --tag=-$1 --env "$2" --out /tmp/ct_$1.md \
      > $OUT/ct_$1.log 2>&1; echo "== ct $1 rc $?"
  cp /tmp/ct_$1.md /tmp/ct_$1.json $OUT/ 2>/dev/null
  grep -E "^\| [a-z]|^POOL|Error" $OUT/ct_$1.log | grep -v "^| program" | cut -c1-500
}
ct off HLOTK_SPLIT_ACC_REGISTERS=0
ct r64 HLOTK_SPLIT_ACC_REGISTERS=64
# 3. the tiles alone (defaults before the bound: 64x128 w8)
L=$(left 230); [ "$L" -gt 75 ] && L=75
HLOTK_SPLIT_ACC_REGISTERS=0 HLOTK_CACHE_DIR=/tmp/hlotk_pc timeout $L python3 -m benchmarks.partials_configs \
    --min-us 8 > $OUT/partials.log 2>&1; echo "== partials rc $? ($L s)"
grep -E "^\||triton|Error|failed" $OUT/partials.log | cut -c1-220
# 4. tests on the GPU
L=$(left 282); [ "$L" -gt 50 ] && L=50
HLOTK_CACHE_DIR=/tmp/hlotk_t timeout $L python3 -m pytest -q -p no:cacheprovider -n 4 \
    tests/test_column_tiles.py > $OUT/t_col.log 2>&1; echo "== tests rc $?"
grep -E "passed|failed" $OUT/t_col.log | tail -1; grep -E "^FAILED|^ERROR" $OUT/t_col.log | head
# 5. a second pair of cold rows, r32, if the time allows
for pair in "r32 HLOTK_SPLIT_ACC_REGISTERS=32" "off2 HLOTK_SPLIT_ACC_REGISTERS=0" "r64b HLOTK_SPLIT_ACC_REGISTERS=64"; do
  if [ "$(left 280)" -gt 45 ]; then ct $pair; else echo "skipped $pair"; fi
done
echo "total $(( $(date +%s) - T0 )) s"

#!/usr/bin/env bash
# i13-triton-slow, one device call (run from the repository root of the lead's checkout,
# the branch under .dev/i13-triton-slow): conv_bn_grad's batch-norm partials kernels at
# each tile (compile seconds, registers/spills, µs, L2 flushed), its cold first call before
# (main, the root) and after (the branch), gpu_suite's device ms after (XLA in the same
# run), the column-tile gpu tests, and gpu_suite before if the time allows.
set -u
OUT=${OUT:-/tmp}
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false
BR=.dev/i13-triton-slow
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
(cd $BR && timeout 30 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1)
timeout 30 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
MC=$(mktemp -d)
# 1. the partials kernels' tiles (branch; its defaults are 8 warps)
(cd $BR && PYTHONPATH=$PWD HLOTK_CACHE_DIR=/tmp/hlotk_pc timeout 80 python3 -m benchmarks.partials_configs \
    --min-us 8 > $OUT/partials.log 2>&1; echo "== partials rc $?")
grep -E "^\||triton|Error" $OUT/partials.log | cut -c1-220
# 2. cold first call, before (main) and after (branch)
ct() {  # dir, tag
  (cd $1 && PYTHONPATH=$PWD timeout 55 python3 -m benchmarks.compile_time --autotune 1 \
      --machine-cache $MC --runs cold --child-timeout 50 --only conv_bn_grad --tag=-$2 \
      --out /tmp/ct_$2.md > $OUT/ct_$2.log 2>&1; echo "== ct $2 rc $?")
  cp /tmp/ct_$2.md /tmp/ct_$2.json $OUT/ 2>/dev/null
  grep -E "^\| [a-z]|^POOL|^LIB|Error" $OUT/ct_$2.log | grep -v "^| program" | cut -c1-600
}
ct . before
ct $BR after
# 3. device ms after, XLA beside it
(cd $BR && PYTHONPATH=$PWD HLOTK_CACHE_DIR=/tmp/hlotk_gs_a timeout 75 python3 -m benchmarks.gpu_suite \
    --heldout --only conv_bn_grad --out $OUT/gs_after.md > $OUT/gs_after.log 2>&1; echo "== gs after rc $?")
grep -E "^\| ResNet|^\| [a-zA-Z].*conv|Error" $OUT/gs_after.md $OUT/gs_after.log | cut -c1-400
grep -E "partials" $OUT/gs_after.md | head -8 | cut -c1-200
# 4. the column-tile tests on the GPU (the branch)
(cd $BR && PYTHONPATH=$PWD HLOTK_CACHE_DIR=/tmp/hlotk_t timeout 45 python3 -m pytest -q -p no:cacheprovider \
    -n 4 tests/test_column_tiles.py > $OUT/t_col.log 2>&1; echo "== tests rc $?")
grep -E "passed|failed" $OUT/t_col.log | tail -1; grep -E "^FAILED|^ERROR" $OUT/t_col.log | head
# 5. device ms before (main), if the time allows
L=$(left 285)
if [ "$L" -gt 45 ]; then
  PYTHONPATH=$PWD HLOTK_CACHE_DIR=/tmp/hlotk_gs_b timeout $L python3 -m benchmarks.gpu_suite \
      --heldout --only conv_bn_grad --out $OUT/gs_before.md > $OUT/gs_before.log 2>&1
  echo "== gs before rc $?"
  grep -E "^\| ResNet|^\| [a-zA-Z].*conv|Error" $OUT/gs_before.md $OUT/gs_before.log | cut -c1-400
  grep -E "partials" $OUT/gs_before.md | head -8 | cut -c1-200
else
  echo "gs before skipped ($L s left)"
fi
echo "total $(( $(date +%s) - T0 )) s"

#!/bin/bash
# Issue 13 device run (i13-warm): hlotk's first call cold/warm beside XLA, this tree
# ("after") and the lead's checkout two levels up ("before", main), plus the gpu tests of
# the touched files. Run from this tree's root on the device:
#   [CT_EXTRA=--cprofile] bash benchmarks/device/compile_time_run.sh PROGRAMS_AFTER PROGRAMS_BEFORE \
#       T_AFTER T_TESTS T_BEFORE      (seconds per step; 0 skips the tests / the before run)
set -u
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false
HERE=$PWD
MAIN=$(cd ../.. && pwd)
AFTER=${1:-transformer,mlp_train,adam_step,softmax}
BEFORE=${2:-transformer,mlp_train,adam_step,softmax}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import triton, jax, torch; print('triton', triton.__version__, 'jax', jax.__version__, 'torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
MC=/tmp/hlotk_machine_i13
rm -rf "$MC"
cd "$HERE" && PYTHONPATH=$HERE timeout "${3:-160}" python3 -m benchmarks.compile_time --autotune 1 \
    --only "$AFTER" --machine-cache "$MC" ${CT_EXTRA:-} --out "$OUT/after.md" > "$OUT/after.log" 2>&1
echo "after rc=$?"
if [ "${4:-100}" -gt 0 ]; then
  cd "$HERE" && HLOTK_CACHE_DIR=/tmp/hlotk_cache PYTHONPATH=$HERE timeout "${4:-100}" python3 -m pytest -q \
      -m gpu -n 4 -p no:cacheprovider tests/test_compile_caches.py tests/test_autotune.py \
      tests/test_native_launcher.py tests/test_cuda_runtime.py tests/test_fusion_attention.py \
      tests/test_codegen_triton.py \
      > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"
fi
if [ "${5:-110}" -gt 0 ]; then
  cd "$MAIN" && PYTHONPATH=$MAIN timeout "${5:-110}" python3 -m benchmarks.compile_time --autotune 1 \
      --only "$BEFORE" --out "$OUT/before.md" > "$OUT/before.log" 2>&1
  echo "before rc=$?"
fi
echo "== after"; grep -E "^\||^Once" "$OUT/after.log" | grep -v -- "---" | head -40
echo "== tests"; tail -4 "$OUT/tests.log" 2>/dev/null
echo "== before"; grep -E "^\|" "$OUT/before.log" 2>/dev/null | grep -v -- "---" | head -20

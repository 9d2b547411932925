#!/bin/bash
# Issue 13 device run (i13-cold): the cold/warm first call, this tree ("after") and the
# lead's checkout two levels up ("before", main, timed by this tree's benchmark script),
# a variant of "after" (--env), a worker probe, and the gpu tests of the touched files.
# Both trees are byte-compiled first, as `pip install` leaves a package (the image sets
# PYTHONDONTWRITEBYTECODE, so otherwise every process compiles hlotk's modules from source).
#   bash benchmarks/device/i13_cold_run.sh AFTER BEFORE T_AFTER T_PROBE T_TESTS T_BEFORE \
#       [VARIANT_PROGRAMS VARIANT_ENV T_VARIANT] [CPROFILE_PROGRAMS]
set -u
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false
HERE=$PWD
MAIN=$(cd ../.. && pwd)
AFTER=${1:-transformer,mlp_train,adam_step,softmax,layernorm,gelu_mlp,s8_gemm,giou,int8_matmul}
BEFORE=${2:-softmax,transformer,adam_step}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import triton, jax, torch; print('triton', triton.__version__, 'jax', jax.__version__, 'torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
nproc | tee -a "$OUT/gpu.txt"
rm -rf /tmp/before && mkdir -p /tmp/before
(cd "$MAIN" && tar --exclude=./.dev -cf - .) | tar -C /tmp/before -xf -
cp "$HERE/benchmarks/compile_time.py" /tmp/before/benchmarks/compile_time.py
for d in "$HERE" /tmp/before; do
  (cd "$d" && timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1)
done
MC=/tmp/hlotk_machine_i13c
rm -rf "$MC"
t=$(date +%s)
cd "$HERE" && PYTHONPATH=$HERE timeout "${3:-190}" python3 -m benchmarks.compile_time --autotune 1 \
    --only "$AFTER" --machine-cache "$MC" --cprofile-only "${10:-}" \
    --out "$OUT/after.md" > "$OUT/after.log" 2>&1
echo "after rc=$? $(( $(date +%s) - t )) s"
if [ -n "${7:-}" ]; then
  t=$(date +%s)
  cd "$HERE" && PYTHONPATH=$HERE timeout "${9:-40}" python3 -m benchmarks.compile_time --autotune 1 \
      --only "$7" --machine-cache "$MC" --env "$8" --tag " [$8]" \
      --out "$OUT/variant.md" > "$OUT/variant.log" 2>&1
  echo "variant rc=$? $(( $(date +%s) - t )) s"
fi
if [ "${4:-0}" -gt 0 ]; then
  t=$(date +%s)
  cd "$HERE" && PYTHONPATH=$HERE timeout "${4}" python3 -m benchmarks.compile_time \
      --worker-probe 1,4,16:key --machine-cache "$MC" > "$OUT/probe.log" 2>&1
  echo "probe rc=$? $(( $(date +%s) - t )) s"
fi
if [ "${5:-60}" -gt 0 ]; then
  t=$(date +%s)
  cd "$HERE" && HLOTK_CACHE_DIR=/tmp/hlotk_cache PYTHONPATH=$HERE timeout "${5:-60}" python3 -m pytest -q \
      -m gpu -n 4 -p no:cacheprovider tests/test_autotune.py tests/test_compile_caches.py \
      tests/test_cuda_runtime.py tests/test_compile_pool.py > "$OUT/tests.log" 2>&1
  echo "tests rc=$? $(( $(date +%s) - t )) s"
fi
if [ "${6:-60}" -gt 0 ]; then
  t=$(date +%s)
  cd /tmp/before && PYTHONPATH=/tmp/before timeout "${6:-60}" python3 -m benchmarks.compile_time \
      --autotune 1 --only "$BEFORE" --machine-cache "$MC" --out "$OUT/before.md" > "$OUT/before.log" 2>&1
  echo "before rc=$? $(( $(date +%s) - t )) s"
fi
cd "$HERE"
echo "== after"; grep -E "^\| |^Once|^POOL" "$OUT/after.log" | grep -v -- "---" | awk '!seen[$0]++' | cut -c1-330 | head -60
echo "== variant"; grep -E "^\| |^POOL" "$OUT/variant.log" 2>/dev/null | grep -v -- "---" | awk '!seen[$0]++' | cut -c1-300
echo "== probe"; grep -E "^\| probe" "$OUT/probe.log" 2>/dev/null
echo "== tests"; tail -3 "$OUT/tests.log" 2>/dev/null
echo "== before"; grep -E "^\| " "$OUT/before.log" 2>/dev/null | grep -v -- "---" | awk '!seen[$0]++' | cut -c1-200 | head -20

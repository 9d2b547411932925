#!/usr/bin/env bash
# i13-launch (issue 13, cold first call without Triton's C launcher), device script.
#   cd .dev/i13-launch && bash benchmarks/device/i13_launch_run.sh tests   (call 1)
#   cd .dev/i13-launch && bash benchmarks/device/i13_launch_run.sh bench   (call 2)
# tests: the direct launch's GPU tests first (a broken launch stops here), then the GPU tests
# of the files this branch touches and the runtime's, then softmax's cold/warm first call.
# bench: this branch ("after") and main (the lead's checkout, the run's root: "before") on
# five suite programs, then two held-out programs (benchmarks/heldout_programs.py); both trees
# byte-compiled first.
set -u
OUT=${OUT:-/tmp}
WHAT=${1:-tests}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu
ROOT=$(cd ../.. && pwd)
timeout 15 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks tests > /dev/null 2>&1
(cd $ROOT && timeout 15 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks \
    > /dev/null 2>&1)
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import triton, jax, torch; print('triton', triton.__version__, 'jax', jax.__version__, 'torch', torch.__version__)"
if [ "$WHAT" = tests ]; then
  export HLOTK_CACHE_DIR=/tmp/hlotk_cache XLA_PYTHON_CLIENT_PREALLOCATE=false
  timeout 60 python3 -m pytest -q -p no:cacheprovider -rA tests/test_direct_launch.py \
      > $OUT/t_direct.log 2>&1
  echo "direct tests rc $?"; grep -E "passed|failed" $OUT/t_direct.log | tail -1
  grep -E "^FAILED|^ERROR|Error" $OUT/t_direct.log | head -20
  timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 -m gpu tests/test_cuda_runtime.py \
      tests/test_native_launcher.py tests/test_attention_variants.py \
      tests/test_fusion_attention.py > $OUT/t_gpu.log 2>&1
  echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1
  grep -E "^FAILED|^ERROR" $OUT/t_gpu.log | head -20
  timeout 90 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_autotune.py \
      tests/test_compile_caches.py tests/test_compile_pool.py \
      > $OUT/t_files.log 2>&1
  echo "file tests rc $?"; grep -E "passed|failed" $OUT/t_files.log | tail -1
  grep -E "^FAILED|^ERROR" $OUT/t_files.log | head -20
  timeout 40 python3 -m benchmarks.compile_time --autotune 1 --only softmax \
      --out $OUT/smoke.md > $OUT/smoke.log 2>&1
  echo "smoke rc $?"; grep "^| softmax\|^POOL" $OUT/smoke.log | cut -c1-300
else
  timeout 148 python3 -m benchmarks.compile_time --autotune 1 \
      --only softmax,layernorm,giou,adam_step,transformer --out $OUT/after.md > $OUT/after.log 2>&1
  echo "after rc $?"; grep "^|\|^Once" $OUT/after.md | cut -c1-300
  (cd $ROOT && PYTHONPATH=$ROOT timeout 148 python3 -m benchmarks.compile_time --autotune 1 \
      --only softmax,layernorm,giou,adam_step,transformer --out $OUT/before.md > $OUT/before.log 2>&1
   echo "before rc $?"; grep "^| " $OUT/before.md | cut -c1-300)
  timeout 42 python3 -m benchmarks.compile_time --autotune 1 --only lion_step \
      --out $OUT/heldout.md > $OUT/heldout.log 2>&1
  echo "heldout rc $?"; grep "^| " $OUT/heldout.md | cut -c1-300
fi
python3 - $OUT <<'PY'
import json, sys, os
for tag in ("smoke", "after", "before", "heldout", "heldout_triton"):
    f = os.path.join(sys.argv[1], tag + ".json")
    if not os.path.exists(f):
        continue
    for r in json.load(open(f)):
        if r.get("run") in ("cold", "warm"):
            ps = r.get("pool_stats") or {}
            dl = r.get("direct_launch") or {}
            print(tag, r["name"], r["run"], "first", round(r.get("first_call", -1), 3),
                  "xla", round(r.get("xla", -1), 3), "pool", round(r.get("pool", -1), 3),
                  "wall", round(ps.get("wall_s", -1), 3), "spec", round(ps.get("spec_s", -1), 3),
                  "triton", round(r.get("triton", -1), 3), "imports",
                  [m for m in (r.get("first_call_imports") or [0, []])[1]
                   if "launcher" in m or "cuda_utils" in m],
                  "direct", {k: dl.get(k) for k in ("loaded", "triton", "launches")},
                  "why", dl.get("why_triton"), "rel_err", r.get("max_rel_err"),
                  "failed", (r.get("failed") or "")[-300:])
PY

#!/bin/bash
# i12-giou's device runs: GPU tests of the touched files, GIOU's kernel per configuration
# beside XLA's, the suite programs in interleaved rounds (tile modes as variants), the FFI
# handler's steps for Adam, the call timeline, the zoo's GPU tests.
# Usage on the device machine, from the repository root: bash benchmarks/i12_giou_gpu_run.sh
# (PARTS picks steps: tests,configs,rounds,handler,timeline,zoo; *_T are per-step timeouts.)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
export XLA_PYTHON_CLIENT_PREALLOCATE=false TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PARTS=${PARTS:-tests,configs,rounds,handler,zoo}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if has tests; then
  echo "== tests"
  timeout ${TESTS_T:-60} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_minor_tiles.py 2>&1 | tail -3
fi
if has configs; then
  echo "== GIOU's kernel per configuration (CUPTI)"
  timeout ${CONFIGS_T:-70} python3 -m benchmarks.loop_configs --only giou 2>&1 | grep -v -i warn | tail -16
fi
if has rounds; then
  echo "== suite rounds"
  timeout ${ROUNDS_T:-130} python3 -m benchmarks.suite_rounds --only ${ONLY:-giou,softmax,adam_step,s8_gemm} \
      --rounds ${ROUNDS:-6} --variant "vstore:HLOTK_MINOR_TILES=vstore" --variant "no tiles:HLOTK_MINOR_TILES=0" \
      --kernels giou --out "$OUT/suite_rounds.md" 2>&1 | grep -v -i warn | tail -34
fi
if has handler; then
  echo "== Adam's FFI handler"
  timeout ${HANDLER_T:-50} python3 -m benchmarks.handler_split --only adam_step 2>&1 | grep -v -i warn | tail -12
fi
if has timeline; then
  echo "== call timeline"
  timeout ${TIMELINE_T:-70} python3 -m benchmarks.call_timeline --only giou,adam_step --rounds 1 \
      --reps ${REPS:-20} --profile --variant "no tiles:HLOTK_MINOR_TILES=0" \
      --out "$OUT/call_timeline.md" 2>&1 | grep -v -i warn | tail -60
fi
if has zoo; then
  echo "== zoo and launcher GPU tests"
  timeout ${ZOO_T:-90} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_runtime.py \
      tests/test_native_launcher.py -k "zoo_on_gpu or giou" 2>&1 | tail -3
fi

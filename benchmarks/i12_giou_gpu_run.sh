#!/bin/bash
# i12-giou's device run (one call): GPU tests of the touched files, XLA's GIOU kernel (PTX),
# the suite programs in interleaved rounds (tiles on/off), the call timeline of GIOU and Adam.
# Usage on the device machine, from the repository root: bash benchmarks/i12_giou_gpu_run.sh
# (PARTS picks steps: tests,xla,rounds,timeline,zoo; the *_T variables are per-step timeouts.)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
export XLA_PYTHON_CLIENT_PREALLOCATE=false TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PARTS=${PARTS:-tests,xla,rounds,timeline,zoo}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
if has tests; then
  echo "== tests"
  timeout ${TESTS_T:-60} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_minor_tiles.py \
      2>&1 | tail -4 | tee "$OUT/tests.txt"
fi
if has xla; then
  echo "== XLA's GIOU (dump)"
  timeout ${XLA_T:-30} env XLA_FLAGS="--xla_dump_to=$OUT/xla_dump --xla_dump_hlo_as_text" python3 -c "
import numpy as np, jax
from tests.zoo import giou_boxes
b = np.abs(np.random.default_rng(0).standard_normal((1024, 256, 4))).astype(np.float32)
jax.block_until_ready(jax.jit(giou_boxes)(b, b))" 2>&1 | tail -2
  for f in "$OUT"/xla_dump/*.ptx; do
    [ -f "$f" ] || continue
    echo "$f"; grep -oE "ld\.global[.a-z0-9]*|st\.global[.a-z0-9]*|div[.a-z0-9]*|\.maxntid.*|\.reqntid.*" "$f" | sort | uniq -c
  done 2>/dev/null | head -20
  grep -h "launch\|block\|thread" "$OUT"/xla_dump/*after_optimizations.txt 2>/dev/null | head -5
fi
if has rounds; then
  echo "== suite rounds"
  timeout ${ROUNDS_T:-130} python3 -m benchmarks.suite_rounds --only ${ONLY:-giou,softmax,adam_step,s8_gemm} \
      --rounds ${ROUNDS:-4} --variant "no tiles:HLOTK_MINOR_TILES=0" --kernels giou \
      --out "$OUT/suite_rounds.md" 2>&1 | grep -v Warning | tail -32
fi
if has timeline; then
  echo "== call timeline"
  timeout ${TIMELINE_T:-70} python3 -m benchmarks.call_timeline --only giou,adam_step --rounds 1 \
      --reps ${REPS:-20} --profile --variant "no tiles:HLOTK_MINOR_TILES=0" \
      --out "$OUT/call_timeline.md" 2>&1 | grep -v Warning | tail -60
fi
if has zoo; then
  echo "== zoo and launcher GPU tests"
  timeout ${ZOO_T:-90} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_runtime.py \
      tests/test_native_launcher.py -k "zoo_on_gpu or giou" 2>&1 | tail -6 | tee "$OUT/zoo.txt"
fi

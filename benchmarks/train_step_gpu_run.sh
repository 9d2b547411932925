#!/bin/bash
# One device call for the issue-14 training step (i14-step): the suite's training step with
# the per-kernel breakdown, before (baseline pipeline) and after, beside XLA; then the
# gpu_suite programs the fusion change touches. Run from the repository root on the GPU.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu \
    XLA_PYTHON_CLIENT_PREALLOCATE=false HLOTK_CACHE_DIR=/tmp/hlotk_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used --format=csv
timeout "${SUITE_S:-300}" python3 -m benchmarks.attention --only suite --kernels \
    --baseline "${BASELINE:-main}" --programs "${PROGRAMS:-transformer_train,train_baseline}" \
    --out "$OUT/suite.json" > "$OUT/suite.log" 2>&1
echo "suite rc=$?"; grep -v "^ *[0-9.]* ms  " "$OUT/suite.log" | tail -${TAIL:-75}
if [ -n "$GPU_SUITE" ]; then
  timeout "${GPU_SUITE_S:-110}" python3 -m benchmarks.gpu_suite --only "$GPU_SUITE" \
      --out "$OUT/gpu_suite.md" > "$OUT/gpu_suite.log" 2>&1
  echo "gpu_suite rc=$?"; grep "^| " "$OUT/gpu_suite.log" | head -6
fi
if [ -n "$PYTEST" ]; then
  timeout "${PYTEST_S:-90}" python3 -m pytest -q -p no:cacheprovider -m gpu $PYTEST \
      > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?"; tail -5 "$OUT/pytest.log"
fi

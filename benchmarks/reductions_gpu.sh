#!/bin/bash
# Issue 14's reductions on the GPU machine, one call: the reduction-template tests, the
# cross-entropy and training step against XLA (benchmarks/attention.py), every reduction
# kernel of the suite and issue 14 (legacy templates beside; ZOO=1 adds the zoo), then the
# CUDA runtime's gpu tests with what time is left. Each step has its own timeout.
set -u
export PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false \
       HLOTK_CACHE_DIR=/tmp/hlotk_cache PYTHONUNBUFFERED=1
O=${OUT:-/tmp/reductions_out}
BUDGET=${BUDGET:-400}
mkdir -p "$O"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
left() { echo $((BUDGET - SECONDS)); }
# every test of the reduction templates runs for real here (no interpreter on a GPU)
HLOTK_AUTOTUNE=0 timeout 70 python3 -m pytest -q -p no:cacheprovider tests/test_reduction_templates.py \
    > "$O/tests.log" 2>&1
echo "tests rc=$? ${SECONDS} s"; tail -3 "$O/tests.log"
timeout 190 python3 -m benchmarks.attention --only ${ATTN:-xent,suite} \
    --programs ${SUITE:-transformer_train} > "$O/attention.log" 2>&1
echo "attention rc=$? ${SECONDS} s"; grep -v "^ \|^[0-9. ]*ms " "$O/attention.log" | tail -22 | cut -c1-400
HLOTK_AUTOTUNE=0 timeout $(( $(left) > 20 ? $(left) - 15 : 5 )) python3 -m benchmarks.reductions \
    --only suite,issue14${ZOO:+,zoo} --jsonl "$O/red.jsonl" > "$O/red.log" 2>&1
echo "reductions rc=$? ${SECONDS} s"
python3 -m benchmarks.reductions --merge "$O/red.jsonl" --out "$O/reductions.md" | cut -c1-330
if [ "$(left)" -gt 40 ]; then
  timeout $(( $(left) - 5 )) python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_runtime.py \
      > "$O/cuda_runtime.log" 2>&1
  echo "cuda_runtime rc=$? ${SECONDS} s"; tail -3 "$O/cuda_runtime.log"
fi

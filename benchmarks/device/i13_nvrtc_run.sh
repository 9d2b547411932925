#!/bin/bash
# One device call (issue 13, i13-nvrtc): the CUDA C loop emitter (codegen/cuda_c) against
# Triton: its gpu tests, cold first call of giou and adam_step under both emitters (XLA
# beside), device time per program under both, then the zoo's gpu test under cuda.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false
export HLOTK_CACHE_DIR=/tmp/hlotk_cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 20 python3 -c "
from codegen.cuda_c import nvrtc; nv = nvrtc.load(); print('nvrtc', nv.path, nv.version)
import shutil; print('g++', shutil.which('g++'))" 2>&1 | tail -3
HLOTK_LOOP_EMITTER=cuda timeout 60 python3 -m pytest -q -v -p no:cacheprovider tests/test_cuda_c.py -k "gpu or nvrtc or compile_error" > $OUT/test_cuda_c.log 2>&1; echo "test_cuda_c rc $?"; grep -E "FAILED|ERROR|passed|failed" $OUT/test_cuda_c.log | tail -12
M=/tmp/hlotk_ct_machine; mkdir -p $M
timeout 60 python3 -m benchmarks.compile_time --autotune 1 --runs cold --only giou,adam_step --machine-cache $M --env HLOTK_LOOP_EMITTER=cuda --tag " cuda" --out $OUT/ct_cuda.md > $OUT/ct_cuda.log 2>&1; echo "ct cuda rc $?"
timeout 50 python3 -m benchmarks.compile_time --autotune 1 --runs cold --only giou,adam_step --machine-cache $M --env HLOTK_LOOP_EMITTER=triton --tag " triton" --out $OUT/ct_triton.md > $OUT/ct_triton.log 2>&1; echo "ct triton rc $?"
HLOTK_LOOP_EMITTER=cuda timeout 55 python3 -m benchmarks.gpu_suite --only giou,adam_step --out $OUT/suite_cuda.md > $OUT/suite_cuda.log 2>&1; echo "suite cuda rc $?"
HLOTK_LOOP_EMITTER=triton timeout 55 python3 -m benchmarks.gpu_suite --only giou,adam_step --out $OUT/suite_triton.md > $OUT/suite_triton.log 2>&1; echo "suite triton rc $?"
HLOTK_LOOP_EMITTER=cuda timeout 35 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_cuda_runtime.py -k zoo_on_gpu > $OUT/zoo_cuda.log 2>&1; echo "zoo cuda rc $?"
echo "zoo: $(grep -c PASSED $OUT/zoo_cuda.log) passed, $(grep -c FAILED $OUT/zoo_cuda.log) failed"; grep FAILED $OUT/zoo_cuda.log | head -5
grep -h "^| giou\|^| adam" $OUT/ct_cuda.md $OUT/ct_triton.md
python3 - <<'PY'
import json, os
for v in ("cuda", "triton"):
    p = f"{os.environ['OUT']}/ct_{v}.json"
    for r in (json.load(open(p)) if os.path.exists(p) else []):
        if r.get("run") == "cold":
            print(v, r.get("name"), "first", round(r.get("first_call", -1), 3), "xla", round(r.get("xla", -1), 3),
                  "pool", round(r.get("pool", 0), 3), "warmup", round(r.get("warmup", 0), 3),
                  "codegen", round(r.get("codegen", 0), 3), "err", r.get("max_rel_err"), r.get("cuda_c"))
PY
grep -h "giou\|adam" $OUT/suite_cuda.md $OUT/suite_triton.md | head -8
grep -h "Error\|Traceback" $OUT/ct_cuda.log $OUT/suite_cuda.log | head -6

#!/bin/bash
# Follow-up device call (issue 13, i13-nvrtc; not run in the session that wrote it): the
# CUDA C loop kernels at four elements a thread (default from 2^19 elements) and at one
# (HLOTK_CUDA_C_PER_THREAD=1, what the first call measured), against Triton: device time of
# giou and adam_step, then the cold first call with NVRTC prewarmed, then the gpu tests.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false
export HLOTK_CACHE_DIR=/tmp/hlotk_cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
for v in "cuda 0" "cuda 1" "triton 0"; do
  set -- $v
  P=""; [ "$2" != 0 ] && P="HLOTK_CUDA_C_PER_THREAD=$2"
  env HLOTK_LOOP_EMITTER=$1 $P timeout 55 python3 -m benchmarks.gpu_suite --only giou,adam_step --out $OUT/suite_$1_$2.md > $OUT/suite_$1_$2.log 2>&1
  echo "suite $1 per_thread=$2 rc $?"; grep -E "^\| (GIOU|Adam)" $OUT/suite_$1_$2.md | cut -d'|' -f2,3,5,8,14
done
M=/tmp/hlotk_ct_machine; mkdir -p $M
timeout 60 python3 -m benchmarks.compile_time --autotune 1 --runs cold --only giou,adam_step --machine-cache $M --env HLOTK_LOOP_EMITTER=cuda --tag " cuda" --out $OUT/ct_cuda.md > $OUT/ct_cuda.log 2>&1; echo "ct cuda rc $?"
grep -h "^| giou\|^| adam" $OUT/ct_cuda.md
HLOTK_LOOP_EMITTER=cuda timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_c.py -k "gpu or nvrtc" > $OUT/test_cuda_c.log 2>&1; echo "test_cuda_c rc $?"; tail -2 $OUT/test_cuda_c.log
HLOTK_LOOP_EMITTER=cuda timeout 45 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_runtime.py -k zoo_on_gpu > $OUT/zoo_cuda.log 2>&1; echo "zoo cuda rc $?"; tail -2 $OUT/zoo_cuda.log

#!/usr/bin/env bash
# i13-cudac-flat, call 1: the CUDA C flat loop kernels (codegen/cuda_c/flat.py) on the GPU:
# gpu tests, Adam's update kernels alone against Triton's and XLA's (per kernel, CUPTI), and
# the whole adam_step's kernel sum per step with the emitters and launch variants
# interleaved in one process (suite_rounds, 3 CUPTI passes, sides rotated); mlp_train too.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks tests > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
HLOTK_CACHE_DIR=/tmp/hc_t timeout 60 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu \
    tests/test_cuda_c_flat.py tests/test_cuda_c.py tests/test_flat_loop.py > $OUT/t_gpu.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu.log | tail -1; grep -E "^FAILED|^ERROR|Error" $OUT/t_gpu.log | head -8
HLOTK_CACHE_DIR=/tmp/hc_k timeout 60 python3 -m benchmarks.adam_kernels > $OUT/adam_kernels.md 2> $OUT/adam_kernels.err
echo "adam_kernels rc $?"; grep "^|" $OUT/adam_kernels.md | cut -c1-200; tail -3 $OUT/adam_kernels.err
HLOTK_CACHE_DIR=/tmp/hc_r timeout 75 python3 -m benchmarks.suite_rounds --only adam_step --rounds 1 \
    --kernel-rounds 3 --variant "triton:HLOTK_LOOP_EMITTER=triton" --variant "cuda:HLOTK_LOOP_EMITTER=cuda" \
    --variant "c128:HLOTK_LOOP_EMITTER=cuda,HLOTK_CUDA_C_FLAT_LAUNCH=128" \
    --variant "w1:HLOTK_LOOP_EMITTER=cuda,HLOTK_CUDA_C_FLAT_LAUNCH=256/1" \
    --variant "restrict:HLOTK_LOOP_EMITTER=cuda,HLOTK_CUDA_C_RESTRICT=1" \
    --variant "strided:HLOTK_LOOP_EMITTER=cuda,HLOTK_CUDA_C_FLAT=0" \
    --kernels adam_step --out $OUT/rounds_adam.md > $OUT/rounds_adam.log 2>&1
echo "suite_rounds adam rc $?"; grep -E "err vs|^- |^\| adam" $OUT/rounds_adam.log | cut -c1-230; tail -2 $OUT/rounds_adam.log
HLOTK_CACHE_DIR=/tmp/hc_r timeout 70 python3 -m benchmarks.suite_rounds --only mlp_train --rounds 1 \
    --kernel-rounds 2 --variant "triton:HLOTK_LOOP_EMITTER=triton" --variant "cuda:HLOTK_LOOP_EMITTER=cuda" \
    --kernels mlp_train --out $OUT/rounds_mlp.md > $OUT/rounds_mlp.log 2>&1
echo "suite_rounds mlp rc $?"; grep -E "err vs|^- |^\| mlp" $OUT/rounds_mlp.log | cut -c1-230; tail -2 $OUT/rounds_mlp.log

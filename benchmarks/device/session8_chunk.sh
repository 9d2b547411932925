#!/usr/bin/env bash
# Session 8: adam_step's device time (graph replays, L2 flushed) with CUDA C flat chunks of
# 16, 32 and 64 bytes against Triton's flat kernels, interleaved in one process.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
timeout 200 python3 -m benchmarks.emitter_ab --only adam_step --rounds 7 \
    --sides "auto;triton;c32:HLOTK_CUDA_C_FLAT_CHUNK=32;c64:HLOTK_CUDA_C_FLAT_CHUNK=64;c32t128:HLOTK_CUDA_C_FLAT_CHUNK=32,HLOTK_CUDA_C_FLAT_LAUNCH=128" 2>&1 | grep -E "^\{|Error" | tail -3

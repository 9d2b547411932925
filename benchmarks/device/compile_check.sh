#!/usr/bin/env bash
# Lead, fifth 2026-11-26 session: issue 13's cold first call on merged main (level 1 times
# loop kernels predicted >= 10 us; kernels equal but for names share a compile), the same
# with no loop kernel timed (HLOTK_TUNE_LOOPS_FROM_US=inf), and the level-2 gains of
# adam_step's loop kernels (are the "best" times under the memory floor real?).
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu
timeout 30 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
MC=$(mktemp -d)
timeout 90 python3 -m benchmarks.compile_time --autotune 1 --runs cold --machine-cache $MC \
    --only softmax,layernorm,adam_step --out $OUT/ct.md > $OUT/ct.log 2>&1
echo "compile_time rc $?"; grep "^| [a-z]" $OUT/ct.log | grep -v program | cut -c1-300
timeout 35 python3 -m benchmarks.compile_time --autotune 1 --runs cold --machine-cache $MC \
    --env HLOTK_TUNE_LOOPS_FROM_US=inf --tag " (no loop timed)" --only adam_step \
    --out $OUT/untimed.md > $OUT/untimed.log 2>&1
echo "untimed rc $?"; grep "^| [a-z]" $OUT/untimed.log | grep -v program | cut -c1-300
HLOTK_CACHE_DIR=$(mktemp -d) TRITON_CACHE_DIR=$(mktemp -d) timeout 60 python3 \
    -m benchmarks.loop_tuning_gain --only adam_step --out $OUT/gains.md > $OUT/gains.log 2>&1
echo "gains rc $?"; grep -v arn $OUT/gains.log | cut -c1-220 | tail -30

#!/usr/bin/env bash
# Lead, sixth 2026-11-26 session, first call: issue 13's cold first call on every gpu_suite
# program (several have not been measured cold since kernels launch through the driver),
# with each pool job's log in the JSON; then adam_step and layernorm with 8 early workers.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu
timeout 30 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
nproc; nvidia-smi --query-gpu=name --format=csv,noheader
MC=$(mktemp -d)
timeout 330 python3 -m benchmarks.compile_time --autotune 1 --runs cold --machine-cache $MC \
    --child-timeout 60 --out $OUT/ct.md > $OUT/ct.log 2>&1
echo "compile_time rc $?"; grep -E "^\| [a-z]|^POOL|FAILED" $OUT/ct.log | cut -c1-400
timeout 60 python3 -m benchmarks.compile_time --autotune 1 --runs cold --machine-cache $MC \
    --env HLOTK_COMPILE_EARLY=8 --tag " (early 8)" --only layernorm,adam_step \
    --out $OUT/early8.md > $OUT/early8.log 2>&1
echo "early8 rc $?"; grep -E "^\| [a-z]|^POOL" $OUT/early8.log | cut -c1-400

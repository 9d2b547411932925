#!/usr/bin/env bash
# Session 9, final call C: cold then warm (on-disk caches filled, a new process) first calls
# of every gpu_suite program beside XLA's lower+compile (issue 13).
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
MC=$(mktemp -d)
timeout 530 python3 -m benchmarks.compile_time --autotune 1 --machine-cache $MC --child-timeout 100 \
    --out /tmp/ctw.md > /tmp/ctw.log 2>&1
echo "compile_time rc $?"; grep -E "^\| [a-z]" /tmp/ctw.md | grep -v "^| program" | cut -d"|" -f2,3,7,8,9,10,11,15,20,21,22
cp /tmp/ctw.md /tmp/ctw.json $OUT/ 2>/dev/null

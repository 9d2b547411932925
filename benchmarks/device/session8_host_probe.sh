#!/usr/bin/env bash
# Session 8: why adam_step's passes take 0.22-0.25 s in compile_time's GPU child and 0.13 s
# deviceless here: the host's Python speed, background threads of the CUDA client, or neither.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 --version; lscpu | grep -E "Model name|^CPU\(s\)|MHz" | head -4
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
for i in 1 2; do
  JAX_PLATFORMS=cpu timeout 60 python3 -m benchmarks.pass_times adam_step --repeat 5
  JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hc_p$i timeout 60 python3 -m benchmarks.pass_times adam_step --repeat 5 --client
done
MC=$(mktemp -d)
JAX_PLATFORMS=cuda,cpu timeout 200 python3 -m benchmarks.compile_time --autotune 1 --runs cold --repeat 2 \
    --machine-cache $MC --only adam_step --out /tmp/ct.md > /tmp/ct.log 2>&1
echo "compile_time rc $?"; grep -E "^\| [a-z]" /tmp/ct.md | grep -v "^| program" | cut -c1-330
cp /tmp/ct.md /tmp/ct.json $OUT/ 2>/dev/null

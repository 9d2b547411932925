#!/usr/bin/env bash
# Session 7, call 2: every candidate config of the row-normalization kernels, compile seconds
# and device µs (benchmarks/norm_configs.py); the cold first call with the native graph
# and on the Python path (HLOTK_NATIVE=0), interleaved.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu PYTHONPATH=$PWD
timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
timeout 200 python3 -m benchmarks.norm_configs > $OUT/norm.log 2>&1
echo "norm_configs rc $?"; grep "^|" $OUT/norm.log; tail -3 $OUT/norm.log | grep -v "^|"
MC=$(mktemp -d)
for v in native python native python; do
  env=""; [ $v = python ] && env="--env HLOTK_NATIVE=0"
  timeout 120 python3 -m benchmarks.compile_time --autotune 1 --runs cold --machine-cache $MC \
     --only giou,softmax,adam_step $env --tag $v --out $OUT/ct_$v.md > $OUT/ct_$v.log 2>&1
  echo "compile_time $v rc $?"; grep -E "^\| [a-z]" $OUT/ct_$v.md | cut -c1-330 | grep -v "^| program"
done

#!/usr/bin/env bash
# Session 7, call 1: NVRTC's compile time against Triton's (benchmarks/nvrtc_probe.py), and
# the sibling rule's effect on adam_step: cold first call and device time, this tree
# against the one before (.dev/before), interleaved.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu
ROOT=$PWD
timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks .dev/before > /dev/null 2>&1
timeout 150 python3 benchmarks/nvrtc_probe.py > $OUT/nvrtc.log 2>&1
echo "nvrtc probe rc $?"; tail -22 $OUT/nvrtc.log
for tree in after before; do
  d=$ROOT; [ $tree = before ] && d=$ROOT/.dev/before
  (cd $d && PYTHONPATH=$d HLOTK_CACHE_DIR=/tmp/hc_$tree timeout 150 python3 -m benchmarks.gpu_suite \
     --only adam_step --out $OUT/suite_$tree.md > $OUT/suite_$tree.log 2>&1)
  echo "suite $tree rc $?"; grep "^| adam" $OUT/suite_$tree.md | cut -c1-300
done
MC=$(mktemp -d)
for tree in after before after; do
  d=$ROOT; [ $tree = before ] && d=$ROOT/.dev/before
  (cd $d && PYTHONPATH=$d timeout 100 python3 -m benchmarks.compile_time --autotune 1 --runs cold \
     --machine-cache $MC --only adam_step,giou --out $OUT/ct_$tree.md > $OUT/ct_$tree.log 2>&1)
  echo "compile_time $tree rc $?"; grep -E "^\| [a-z]" $OUT/ct_$tree.md | cut -c1-330
done

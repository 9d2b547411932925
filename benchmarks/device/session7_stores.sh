#!/usr/bin/env bash
# Session 7, call 6: loop kernels storing every output after all values are computed,
# against HEAD (.dev/before): CUPTI kernel sums of adam_step and mlp_train (suite_rounds,
# one process per tree, before / after / before / after).
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu
ROOT=$PWD
timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks .dev/before > /dev/null 2>&1
k=0
for tree in before after before after; do
  k=$((k+1)); d=$ROOT; [ $tree = before ] && d=$ROOT/.dev/before
  mkdir -p /tmp/r$k
  (cd $d && OUT=/tmp/r$k PYTHONPATH=$d HLOTK_CACHE_DIR=/tmp/hc_$tree timeout 150 python3 -m benchmarks.suite_rounds \
     --only adam_step,mlp_train --rounds 1 --kernels adam_step,mlp_train --out /tmp/r$k/rounds.md > /tmp/r$k/log 2>&1)
  echo "== $tree rc $?"; grep -E "^- (XLA|hlotk)" /tmp/r$k/rounds.md | cut -c1-200; grep "^| [a-z]" /tmp/r$k/rounds.md | head -4
  cp /tmp/r$k/rounds.md $OUT/rounds_$k.md
done

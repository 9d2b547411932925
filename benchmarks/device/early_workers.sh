#!/usr/bin/env bash
# Lead: does starting 8 compile workers early (HLOTK_COMPILE_EARLY, default 4) shorten the
# cold first call of many-kernel programs, and cost the one-kernel ones nothing?
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu
timeout 30 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
MC=$(mktemp -d)
for round in 1 2; do
  for early in 4 8; do
    timeout 45 python3 -m benchmarks.compile_time --autotune 1 --runs cold --machine-cache $MC \
        --env HLOTK_COMPILE_EARLY=$early --tag " early=$early r$round" \
        --only adam_step,softmax,transformer --out $OUT/e${early}_$round.md > $OUT/e${early}_$round.log 2>&1
    echo "early=$early round $round rc $?"
    grep "^| [a-z]" $OUT/e${early}_$round.log | grep -v program | cut -c1-300 | sort -u
  done
done

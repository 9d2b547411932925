#!/usr/bin/env bash
# Session 8, final call B1: the loop emitters' device time on adam_step and mlp_train
# (graph replays, interleaved), adam_step and giou cold twice more, the held-out programs.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
HLOTK_CACHE_DIR=/tmp/hlotk_cache timeout 150 python3 -m benchmarks.emitter_ab --only adam_step,mlp_train \
    --sides auto,triton --rounds 5 2>&1 | grep -E "^\{|Error|error" | tail -4
MC=$(mktemp -d)
for k in 1 2; do
  timeout 80 python3 -m benchmarks.compile_time --autotune 1 --machine-cache $MC --runs cold --only adam_step,giou \
      --out /tmp/ct_r$k.md > /tmp/ct_r$k.log 2>&1
  echo "adam/giou cold rc $?"; grep -E "^\| [a-z]" /tmp/ct_r$k.md | grep -v "^| program" | cut -d"|" -f2,3,7,8,9,10,11,15,20,21,22
done
cat /tmp/ct_r*.md > $OUT/ct_again.md 2>/dev/null
HLOTK_CACHE_DIR=/tmp/hlotk_cache timeout 170 python3 -m benchmarks.gpu_suite --heldout \
    --only adamw_200,lion_200,gpt_train_step,moe_grad,conv_bn_grad,kv_decode \
    --out /tmp/heldout.md > /tmp/heldout.log 2>&1
echo "heldout rc $?"; grep "^| [A-Za-z]" /tmp/heldout.md | grep -v "^| program" | cut -d'|' -f2,3,4,5,6,7,8,12 | cut -c1-260
cp /tmp/heldout.md $OUT/

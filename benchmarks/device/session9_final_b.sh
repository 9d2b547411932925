#!/usr/bin/env bash
# Session 9, final call B: cold first calls beside XLA's lower+compile (issue 13): adam_step
# and the held-out programs against the session's starting tree ($1, interleaved), then
# every gpu_suite program once. $2: 1 (the first part) or 2.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu
A=$PWD; B=${1:-}
for t in $A $B; do (cd $t && timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1); done
MC=$(mktemp -d)
ct() {  # tree, programs, tag, seconds
  (cd $1 && PYTHONPATH=$PWD timeout $4 python3 -m benchmarks.compile_time --autotune 1 --runs cold \
      --machine-cache $MC --only $2 --child-timeout 100 --out /tmp/ct_$3.md > /tmp/ct_$3.log 2>&1
   echo "== $3 rc $?"; grep -E "^\| [a-z]" /tmp/ct_$3.md | grep -v "^| program" | cut -d"|" -f2,3,7,8,9,10,11,15,20,21,22)
}
if [ "${2:-1}" = 1 ]; then
  ct $A adam_step,adamw_200,lion_200,conv_bn_grad 1a 170
  [ -n "$B" ] && ct $B adam_step,adamw_200,lion_200,conv_bn_grad 1b 170
  ct $A adam_step,conv_bn_grad 1c 100
else
  ct $A adam_step,moe_grad,lstm_grad 2a 150
  ct $A giou,softmax,layernorm,gelu_mlp,s8_gemm,int8_matmul,transformer,mlp_train,adam_step 3a 250
fi
python3 -c "import json,glob; json.dump({f: json.load(open(f)) for f in sorted(glob.glob('/tmp/ct_*.json'))}, open('$OUT/ct_rows.json','w'), indent=1)"
cat /tmp/ct_*.md > $OUT/ct_all.md 2>/dev/null

#!/usr/bin/env bash
# i13-cudac-flat, call 2: cold first call (compile_time) of this tree (.dev/i13-cudac-flat,
# auto sends flat loop fusions to CUDA C at any size) and main's (.dev/i13-cudac-flat-main),
# interleaved main / branch / branch / main; the gpu tests of cuda_c, flat, dedup, zoo on this
# tree; the small-kernel launch (64-thread blocks) and the whole step's kernel sum again.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false
ROOT=$PWD
B=$ROOT/.dev/i13-cudac-flat; M=$ROOT/.dev/i13-cudac-flat-main
nvidia-smi --query-gpu=name --format=csv,noheader
for d in $B $M; do (cd $d && timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks tests > /dev/null 2>&1); done
MB=$(mktemp -d); MM=$(mktemp -d)
k=0
for tree in main branch branch main; do
  k=$((k+1)); d=$B; mc=$MB; [ $tree = main ] && d=$M && mc=$MM
  (cd $d && PYTHONPATH=$d timeout 75 python3 -m benchmarks.compile_time --autotune 1 --runs cold --machine-cache $mc \
     --only adam_step,giou,softmax,layernorm,mlp_train --tag " $tree" --out $OUT/ct_$k.md > $OUT/ct_$k.log 2>&1)
  echo "== compile_time $tree rc $?"; grep -E "^\| [a-z]" $OUT/ct_$k.md | grep -v "^| program" | cut -c1-330
  grep -E "cuda_c|nvrtc" $OUT/ct_$k.log | head -3
done
cd $B
export PYTHONPATH=$B
HLOTK_CACHE_DIR=/tmp/hc_t2 timeout 100 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/ \
    -k "cuda_c or flat or dedup or zoo" > $OUT/t_gpu2.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed" $OUT/t_gpu2.log | tail -1; grep -E "^FAILED|^ERROR" $OUT/t_gpu2.log | head -8
HLOTK_CACHE_DIR=/tmp/hc_k2 timeout 40 python3 -m benchmarks.adam_kernels --sides "hlotk,triton,cuda strided" \
    > $OUT/adam_kernels2.md 2> $OUT/adam_kernels2.err
echo "adam_kernels rc $?"; grep "^|" $OUT/adam_kernels2.md | grep -v "XLA.*\[1, 1, 1\]" | cut -c1-200
HLOTK_CACHE_DIR=/tmp/hc_r2 timeout 45 python3 -m benchmarks.suite_rounds --only adam_step --rounds 1 \
    --kernel-rounds 3 --variant "triton:HLOTK_LOOP_EMITTER=triton" --kernels adam_step \
    --out $OUT/rounds_adam2.md > $OUT/rounds_adam2.log 2>&1
echo "suite_rounds adam rc $?"; grep -E "err vs|^- " $OUT/rounds_adam2.log | cut -c1-200

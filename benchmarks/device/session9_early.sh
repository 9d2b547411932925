#!/usr/bin/env bash
# Session 9: does the early Triton compile pool (4 worker processes started at import and at
# the client, each importing Triton and compiling a small kernel) slow adam_step's cold first
# call, which compiles no Triton kernel? Default against HLOTK_COMPILE_EARLY=0, interleaved;
# the host's CPU as the container sees it; the held-out 200-array steps' phases (baseline).
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu PYTHONPATH=$PWD
{ nproc; cat /sys/fs/cgroup/cpu.max 2>/dev/null; cat /proc/loadavg; grep -m1 "model name" /proc/cpuinfo; } > $OUT/host.txt 2>&1
cat $OUT/host.txt
timeout 60 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
MC=$(mktemp -d)
ct() {  # programs, tag, env
  timeout 150 python3 -m benchmarks.compile_time --autotune 1 --runs cold --repeat 1 \
      --machine-cache $MC --only $1 --child-timeout 100 ${3:+--env $3} --out /tmp/ct_$2.md > /tmp/ct_$2.log 2>&1
  echo "== $2 rc $?"; grep -E "^\| [a-z]" /tmp/ct_$2.md | grep -v "^| program"
}
for r in 1 2 3; do
  ct adam_step d$r
  ct adam_step e$r HLOTK_COMPILE_EARLY=0
done
timeout 60 python3 -m benchmarks.pass_times adam_step --repeat 7 | tee $OUT/pass_times.json
ct adamw_200,lion_200 h1
cat /tmp/ct_*.md > $OUT/ct_all.md 2>/dev/null
python3 -c "import json,glob; json.dump({f: json.load(open(f)) for f in sorted(glob.glob('/tmp/ct_*.json'))}, open('$OUT/ct_rows.json','w'), indent=1)"; ls $OUT

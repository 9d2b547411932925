#!/usr/bin/env bash
# One device call for i13-warm (issue 13, warm first call): this branch's cold/warm first
# calls of five suite programs, the Adam step again with the GC freeze off, and main's (the
# lead's checkout, the run's root) Adam step and MLP train step as "before" on the same
# machine. Both trees byte-compiled first (as an installation leaves them; the image sets
# PYTHONDONTWRITEBYTECODE, which still reads existing bytecode).
#   cd .dev/i13-warm && bash benchmarks/device/i13_warm_run.sh   (tables under $OUT)
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu
ROOT=$(cd ../.. && pwd)
timeout 25 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
(cd $ROOT && timeout 25 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks \
    > /dev/null 2>&1)
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import triton, jax, torch; print('triton', triton.__version__, 'jax', jax.__version__, 'torch', torch.__version__)"
timeout 165 python3 -m benchmarks.compile_time --autotune 1 \
    --only adam_step,transformer,mlp_train,softmax,giou --out $OUT/after.md > $OUT/after.log 2>&1
echo "after rc $?"; grep "^|\|^Once" $OUT/after.md | cut -c1-260
timeout 45 python3 -m benchmarks.compile_time --autotune 1 --only adam_step \
    --env HLOTK_GC_FREEZE=0 --tag=-nofreeze --out $OUT/nofreeze.md > $OUT/nofreeze.log 2>&1
echo "nofreeze rc $?"; grep "^| adam" $OUT/nofreeze.md | cut -c1-260
(cd $ROOT && PYTHONPATH=$ROOT timeout 60 python3 -m benchmarks.compile_time --autotune 1 \
    --only adam_step,mlp_train --out $OUT/before.md > $OUT/before.log 2>&1
 echo "before rc $?"; grep "^| " $OUT/before.md | cut -c1-260)
python3 - $OUT <<'PY'
import json, sys, os
for tag in ("after", "nofreeze", "before"):
    f = os.path.join(sys.argv[1], tag + ".json")
    if not os.path.exists(f):
        continue
    for r in json.load(open(f)):
        if r.get("run") in ("cold", "warm"):
            print(tag, r["name"], r["run"], "first", round(r.get("first_call", -1), 3),
                  "xla", round(r.get("xla", -1), 3), "gc", round(r.get("gc", -1), 3),
                  "full", r.get("gc_full"), "objs", r.get("gc_objects"),
                  "imports", (r.get("first_call_imports") or [None])[0],
                  "rel_err", r.get("max_rel_err"))
PY

#!/usr/bin/env bash
# Lead, sixth session, fourth call: the four new held-out programs (KV-cache decode, MoE,
# ResNet block, LSTM) beside XLA; the 80 MiB split layer-norm gradient pair with i14-pdl's
# 4-warp partials default (timed alone, as the prompt of that helper left unverified).
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 30 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
timeout 270 python3 -m benchmarks.gpu_suite --heldout --only kv_decode,moe_grad,conv_bn_grad,lstm_grad \
    --out $OUT/heldout.md > $OUT/heldout.log 2>&1
echo "heldout rc $?"; grep "^|" $OUT/heldout.md | cut -c1-460
grep -E "host path:|^jit_" $OUT/heldout.md | cut -c1-260
grep -E "Error|Traceback|FAIL" $OUT/heldout.log | head -8 | cut -c1-300
XLA_PYTHON_CLIENT_PREALLOCATE=false HLOTK_AUTOTUNE=0 timeout 60 python3 benchmarks/pdl_probe.py \
    --pairs --modes off --jsonl $OUT/pairs.jsonl > $OUT/pairs.log 2>&1
echo "pairs rc $?"; python3 - <<'PY'
import json, os
p = os.environ.get("OUT", "/tmp") + "/pairs.jsonl"
for ln in (open(p) if os.path.exists(p) else []):
    r = json.loads(ln)
    print(r.get("case"), r.get("what"), {k: (round(v, 2) if isinstance(v, float) else v)
          for k, v in r.items() if k in ("us", "us_again", "pair_us", "partials_only_us",
                                         "copy_us", "vs_copy", "config", "max_rel_err")})
PY

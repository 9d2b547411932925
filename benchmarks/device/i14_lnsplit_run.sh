#!/bin/bash
# One device call (issue 14, i14-lnsplit): the column-tile GPU tests, the LN split
# probe, CUPTI hlotk vs XLA; logs and rows under $OUT, a short table last.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false
export HLOTK_CACHE_DIR=/tmp/hlotk_cache HLOTK_AUTOTUNE=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 50 python3 -m pytest -q -p no:cacheprovider tests/test_column_tiles.py -m gpu > $OUT/test.log 2>&1; echo "test rc $?"; tail -2 $OUT/test.log
timeout 170 python3 benchmarks/ln_split_probe.py --onepass --budget 60 --jsonl $OUT/probe.jsonl > $OUT/probe.log 2>&1; echo "probe rc $?"
timeout 45 python3 benchmarks/ln_split_probe.py --cupti --jsonl $OUT/probe.jsonl > $OUT/cupti.log 2>&1; echo "cupti rc $?"
python3 - <<'PY'
import json, os
for ln in open(os.environ["OUT"] + "/probe.jsonl"):
    r = json.loads(ln)
    if r["what"] == "cupti":
        print(r["case"], "cupti", r["side"], round(r["sum_us"], 1), r["kernels"][:3]); continue
    keys = ["parts", "block_n", "warps", "block_m", "fold", "us", "partials_only_us", "finish_only_us",
            "copy_us", "read_us", "vs_copy", "max_rel_err", "grid", "error"]
    print(r["case"], r["what"], {k: (round(r[k], 2) if isinstance(r[k], float) else r[k]) for k in keys if k in r})
PY
grep -i "error\|Traceback" $OUT/probe.log | head -5

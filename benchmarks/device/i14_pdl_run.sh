#!/bin/bash
# One device call (issue 14, i14-pdl): PDL of the split reductions' finishing kernels and a
# ticketed one-launch tail, against the default; PDL on every kernel of adam_step and
# mlp_train; the GPU tests with HLOTK_PDL=split (and the graph/eager bitwise tests with all).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false
export HLOTK_CACHE_DIR=/tmp/hlotk_cache HLOTK_AUTOTUNE=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import triton, torch; from triton.language.extra import cuda as c; print('triton', triton.__version__, 'torch', torch.__version__, 'gdc', hasattr(c, 'gdc_wait'))"
timeout 110 python3 benchmarks/pdl_probe.py --pairs --ticket --sweep --modes off,split --jsonl $OUT/pdl.jsonl > $OUT/pairs.log 2>&1; echo "pairs rc $?"
HLOTK_PDL=split timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_pdl.py tests/test_column_tiles.py tests/test_reduction_templates.py > $OUT/test_split.log 2>&1; echo "tests (split) rc $?"; tail -3 $OUT/test_split.log
timeout 65 python3 benchmarks/pdl_probe.py --programs adam_step,mlp_train --modes off,all,split --jsonl $OUT/pdl.jsonl > $OUT/programs.log 2>&1; echo "programs rc $?"
HLOTK_PDL=all timeout 35 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_runtime.py -k "graphs_and_no_graphs" > $OUT/test_all.log 2>&1; echo "tests (all) rc $?"; tail -3 $OUT/test_all.log
python3 - <<'PY'
import json, os
p = os.environ["OUT"] + "/pdl.jsonl"
for ln in (open(p) if os.path.exists(p) else []):
    r = json.loads(ln)
    keys = ["pdl_mode", "T", "config", "us", "us_again", "pair_us", "partials_only_us", "copy_us", "vs_copy",
            "race_max_rel_err", "edges", "launch_pdl", "counters_after", "device_ms", "device_ms_again",
            "call_ms", "ok", "max_rel_err", "pdl_kernels", "kernels", "host_path", "error"]
    print(r["case"], r["what"], {k: (round(r[k], 4) if isinstance(r[k], float) else r[k]) for k in keys if k in r},
          {k: v for k, v in r.items() if k.endswith("_error")})
PY
grep -h "Error\|Traceback" $OUT/pairs.log $OUT/programs.log | head -8

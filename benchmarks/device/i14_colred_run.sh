#!/usr/bin/env bash
# i14-colred, one call (~300 s), from the branch's copy under the run's root:
#   cd .dev/i14-colred && bash benchmarks/device/i14_colred_run.sh
# 1. gpu tests of the reduction templates and the column tiles;
# 2. this branch: every split reduction of mlp_train and transformer_train (graph replay),
#    the split cut other ways (--sweep), mlp_train's whole step per kernel (CUPTI, XLA beside);
# 3. main (the run's root, ../..): the same kernels and step, same script;
# 4. this branch: benchmarks.reductions for the suite and issue 14 (graph replay, no legacy);
# 5. with time left: this branch's split kernels again (interleaved repeat).
set -u
OUT=${OUT:-/tmp/colred_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false \
       HLOTK_CACHE_DIR=/tmp/hlotk_cache HLOTK_AUTOTUNE=0
HERE=$PWD
MAIN=$(cd ../.. && pwd)
BUDGET=${BUDGET:-300}
left() { echo $((BUDGET - SECONDS)); }
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
timeout 55 python3 -m pytest -q -p no:cacheprovider -n 3 -m gpu tests/test_reduction_templates.py \
    tests/test_column_tiles.py > "$OUT/t_gpu.log" 2>&1
echo "gpu tests rc $? ${SECONDS}s"; grep -E "passed|failed" "$OUT/t_gpu.log" | tail -1
grep -E "^FAILED|^ERROR|Error" "$OUT/t_gpu.log" | head -5
timeout 80 python3 benchmarks/column_split_sweep.py --tag branch --sweep --sweep-budget 30 \
    --step mlp_train --jsonl "$OUT/sweep.jsonl" > "$OUT/branch.log" 2>&1
echo "branch rc $? ${SECONDS}s"; grep -E "^#|Error" "$OUT/branch.log" | head -12
(cd "$MAIN" && PYTHONPATH=$MAIN timeout 60 python3 "$HERE/benchmarks/column_split_sweep.py" --tag main \
    --step mlp_train --jsonl "$OUT/sweep.jsonl") > "$OUT/main.log" 2>&1
echo "main rc $? ${SECONDS}s"; grep -E "^#|Error" "$OUT/main.log" | head -8
T=$(( $(left) - 25 )); [ $T -lt 30 ] && T=30
timeout $T python3 -m benchmarks.reductions --only suite,issue14 --no-legacy \
    --jsonl "$OUT/red.jsonl" > "$OUT/red.log" 2>&1
echo "reductions rc $? ${SECONDS}s"
python3 -m benchmarks.reductions --merge "$OUT/red.jsonl" --out "$OUT/reductions.md" | head -3 | cut -c1-300
if [ "$(left)" -gt 22 ]; then
  timeout $(( $(left) - 4 )) python3 benchmarks/column_split_sweep.py --tag branch2 --programs mlp_train \
      --jsonl "$OUT/sweep.jsonl" > "$OUT/branch2.log" 2>&1
  echo "branch2 rc $? ${SECONDS}s"
fi
python3 - "$OUT/sweep.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    if r.get("kind") == "step":
        top = [k for k in r["kernels"] if "reduce" in k[0]][:4]
        print(f"STEP {r['tag']:7s} {r['program']} {r['side']:5s} sum {r['sum_us']:8.1f} span {r['span_us']:8.1f} "
              f"launches {r['launches']:.0f} | " + "; ".join(f"{n[:40]} {u}" for n, u, c in top))
    elif r.get("kind") == "default":
        print(f"DEF  {r['tag']:7s} {r['program'][:12]:12s} {r['kernel'][:58]:58s} {r['bytes']/2**20:7.2f}MiB "
              f"{r['us']:7.1f}us copy {r['copy_us']:6.1f} vs {r['vs_copy']:.0%} grid {r['grid']} cfg {r['config']}")
    else:
        v = r.get("variant") or f"P{r.get('parts')} bn{r.get('block_n')} w{r.get('warps')}"
        print(f"SWP  {r['tag']:7s} {r['kernel'][:44]:44s} {v:22s} {r.get('us', float('nan')):7.1f}us "
              f"err {r.get('max_rel_err', float('nan')):.1e} {'(default)' if r.get('default') else ''} {r.get('error', '')[:120]}")
PY

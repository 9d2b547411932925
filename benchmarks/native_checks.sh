#!/usr/bin/env bash
# The GPU checks of issue 12 (runtime/cuda/native), as run on the lent H200: build the
# launcher, then its tests, the zoo against jax.jit and the other GPU test files (three
# pytest processes at once: correctness only, JAX not preallocating), then the timings one
# at a time: host overhead, gpu_suite's host-bound programs. Logs and tables go to $OUT.
#   PART=build,tests,host,suite,suite2 bash benchmarks/native_checks.sh
#   (default build,tests,host,suite: suite is the host-bound half of gpu_suite, suite2 adds
#   the device-bound half). gpucheck: every gpu-marked test but the zoo's, with coverage
#   (the zoo against jax.jit, per program native or Python and why: native_coverage.py, 4
#   shards) at the same time; floor: benchmarks/dispatch_floor.py.
# T_* are the per-part time limits in seconds; ZOO_N sets the zoo's pytest workers.
set -u
OUT=${OUT:-/tmp}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda,cpu}
export HLOTK_CACHE_DIR=${HLOTK_CACHE_DIR:-/tmp/hlotk_cache}
PART=${PART:-build,tests,host,suite}
PYTEST="python3 -m pytest -q -p no:cacheprovider --tb=short -rfEs"
if [[ $PART == *build* ]]; then
  (nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; which c++ g++;
   python3 -c "import jax, torch, triton; print(jax.__version__, torch.__version__, triton.__version__)"
   time timeout ${T_BUILD:-90} python3 -m runtime.cuda.native) > $OUT/build.log 2>&1
  echo "build rc $?"; cat $OUT/build.log | tail -8
fi
if [[ $PART == *tests* ]]; then
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  timeout ${T_NATIVE:-150} $PYTEST tests/test_native_launcher.py > $OUT/t_native.log 2>&1 &
  timeout ${T_ZOO:-150} $PYTEST -n ${ZOO_N:-6} -k test_zoo_on_gpu tests/test_cuda_runtime.py \
      > $OUT/t_zoo.log 2>&1 &
  timeout ${T_REST:-150} $PYTEST -n 3 -m gpu -k "not test_zoo_on_gpu" tests/test_cuda_runtime.py \
      tests/test_cuda_torch_ops.py tests/test_cudnn_conv.py tests/test_triton_transpose.py \
      > $OUT/t_rest.log 2>&1 &
  wait
  unset XLA_PYTHON_CLIENT_PREALLOCATE
fi
if [[ $PART == *gpucheck* ]]; then
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  rm -f /tmp/cov_?.jsonl  # a machine still warm from an earlier call keeps its shards
  timeout ${T_GPU:-220} $PYTEST -n 3 -m gpu -k "not test_zoo_on_gpu" tests/ > $OUT/t_gpu.log 2>&1 &
  for i in 0 1 2 3; do
    timeout ${T_COV:-220} python3 -m benchmarks.native_coverage --shard $i/4 \
        --jsonl /tmp/cov_$i.jsonl > /tmp/cov_$i.log 2>&1 &
  done
  wait
  cat /tmp/cov_?.log | grep -v '^{' > $OUT/coverage.log
  python3 -m benchmarks.native_coverage --merge /tmp/cov_?.jsonl --out $OUT/native_coverage.md \
      > /dev/null 2>&1
  unset XLA_PYTHON_CLIENT_PREALLOCATE
fi
if [[ $PART == *floor* ]]; then
  timeout ${T_FLOOR:-100} python3 -m benchmarks.dispatch_floor --rounds ${ROUNDS:-3} \
      --out $OUT/dispatch_floor.md > $OUT/floor.log 2>&1
  echo "dispatch_floor rc $?"
fi
if [[ $PART == *host* ]]; then
  timeout ${T_HOST:-120} python3 -m benchmarks.host_overhead --rounds ${ROUNDS:-3} \
      --out $OUT/host_overhead.md > $OUT/host.log 2>&1
  echo "host_overhead rc $?"
fi
if [[ $PART == *suite* ]]; then
  # Two halves, the host-bound programs first (each half writes its own table).
  timeout ${T_SUITE1:-100} python3 -m benchmarks.gpu_suite \
      --only adam_step,giou,softmax,s8_gemm,layernorm --out $OUT/gpu_suite_1.md > $OUT/suite_1.log 2>&1
  echo "gpu_suite (host-bound half) rc $?"
  if [[ $PART == *suite2* ]]; then
    timeout ${T_SUITE2:-160} python3 -m benchmarks.gpu_suite \
        --only gelu_mlp,int8_matmul,transformer,mlp_train --out $OUT/gpu_suite_2.md > $OUT/suite_2.log 2>&1
    echo "gpu_suite (device-bound half) rc $?"
  fi
fi
for f in t_native t_zoo t_rest t_gpu; do
  [[ -f $OUT/$f.log ]] && { echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/$f.log | tail -8;
    grep -o "NativeLauncherWarning: hlotk: [a-z_0-9]*: .\{0,160\}" $OUT/$f.log | sort -u | head -12; }
done
[[ -f $OUT/native_coverage.md ]] && cut -c1-300 $OUT/native_coverage.md
[[ -f $OUT/dispatch_floor.md ]] && tail -n +5 $OUT/dispatch_floor.md
[[ -f $OUT/host_overhead.md ]] && sed -n '7,40p' $OUT/host_overhead.md | grep -v '^$' | cut -c1-400
for f in $OUT/gpu_suite_1.md $OUT/gpu_suite_2.md; do
  [[ -f $f ]] && grep "^| " $f | cut -d'|' -f2-8,15 | cut -c1-220
done
exit 0

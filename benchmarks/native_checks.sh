#!/usr/bin/env bash
# The GPU checks of issue 12 (runtime/cuda/native), as run on the lent H200: the native
# launcher's tests, the CUDA runtime's GPU tests (zoo against jax.jit), the other GPU test
# files, then the host-overhead benchmark. Logs and tables go to $OUT (default /tmp).
#   PART=suite,tests,host bash benchmarks/native_checks.sh     (default: tests then host)
# ZOO_FROM=N starts the zoo at program N (the ones before it passed in an earlier run).
set -u
OUT=${OUT:-/tmp}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda,cpu}
export HLOTK_CACHE_DIR=${HLOTK_CACHE_DIR:-/tmp/hlotk_cache}
PART=${PART:-tests,host}
PYTEST="python3 -m pytest -q -p no:cacheprovider --tb=short -rfE"
if [[ $PART == *suite* ]]; then
  # Two halves, the host-bound programs first (each half writes its own table).
  timeout ${T_SUITE1:-150} python3 -m benchmarks.gpu_suite --only adam_step,giou,softmax,s8_gemm,layernorm \
      --out $OUT/gpu_suite_1.md > $OUT/suite_1.log 2>&1
  echo "gpu_suite (host-bound half) rc $?"
  timeout ${T_SUITE2:-200} python3 -m benchmarks.gpu_suite --only gelu_mlp,int8_matmul,transformer,mlp_train \
      --out $OUT/gpu_suite_2.md > $OUT/suite_2.log 2>&1
  echo "gpu_suite (device-bound half) rc $?"
fi
if [[ $PART == *tests* ]]; then
  timeout ${T_NATIVE:-70} $PYTEST tests/test_native_launcher.py > $OUT/t_native.log 2>&1
  echo "native tests rc $?"
  ZOO=$(python3 -c "from tests.zoo import ZOO; import sys; print(' '.join(
      'tests/test_cuda_runtime.py::test_zoo_on_gpu_matches_jax_jit[%s]' % p.name
      for p in ZOO[int(sys.argv[1]):]))" ${ZOO_FROM:-0})
  timeout ${T_ZOO:-150} $PYTEST $ZOO > $OUT/t_zoo.log 2>&1
  echo "zoo rc $?"
  timeout ${T_REST:-120} $PYTEST -m gpu -k "not test_zoo_on_gpu" tests/test_cuda_runtime.py \
      tests/test_cuda_torch_ops.py tests/test_cudnn_conv.py tests/test_triton_transpose.py \
      > $OUT/t_rest.log 2>&1
  echo "other GPU tests rc $?"
fi
if [[ $PART == *host* ]]; then
  timeout ${T_HOST:-170} python3 -m benchmarks.host_overhead --rounds ${ROUNDS:-5} \
      --out $OUT/host_overhead.md > $OUT/host.log 2>&1
  echo "host_overhead rc $?"
fi
for f in t_native t_zoo t_rest; do
  [[ -f $OUT/$f.log ]] && { echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/$f.log | tail -12; }
done
[[ -f $OUT/host_overhead.md ]] && sed -n '5,30p' $OUT/host_overhead.md
for f in $OUT/gpu_suite_1.md $OUT/gpu_suite_2.md; do
  [[ -f $f ]] && grep "^| " $f | cut -d'|' -f2-8,15
done
exit 0

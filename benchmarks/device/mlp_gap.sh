#!/usr/bin/env bash
# Lead, fifth 2026-11-26 session: why mlp_train's first GEMM starts ~50 µs after the
# leading memset in its replayed graph. (1) the native graph's nodes dumped with
# cuGraphDebugDotPrint (verbose), (2) the graph replayed alone, sequence with gaps,
# (3) mlp_train's f32 (TF32) GEMM shapes, each captured alone in a torch CUDA graph and
# replayed: is there a memset, and a gap after it? default cuBLAS vs cuBLASLt preference.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 150 python3 - $OUT > $OUT/gap.log 2>&1 <<'PY'
import ctypes, sys
import jax, torch, runtime
from benchmarks.gpu_suite import programs
from benchmarks.kernel_profile import _trace_kernels, call_sequence, format_sequence
from runtime.cuda import executable_of
out = sys.argv[1]
p = [p for p in programs() if p[0] == "mlp_train"][0]
dev = jax.device_put(p[3]); jax.block_until_ready(dev)
hc = runtime.jit(p[2], backend="cuda").lower(*dev).compile()
for _ in range(3):
    jax.block_until_ready(hc(*dev))
exe = executable_of(hc)
g = exe.native
raw = g._graph.raw_cuda_graph()
cuda = ctypes.CDLL("libcuda.so.1")
rc = cuda.cuGraphDebugDotPrint(ctypes.c_void_p(raw), f"{out}/mlp_graph.dot".encode(), ctypes.c_uint(0xFFFF))
print("dot rc", rc)
print("nodes:", [n.kind for n in g.nodes][:40])
replay = g.replay_on_staging()
recs = _trace_kernels(lambda: (replay(), torch.cuda.synchronize()), 6)
print("-- mlp_train graph replayed alone")
print(format_sequence(call_sequence(recs)))
torch.backends.cuda.matmul.allow_tf32 = True
torch.set_float32_matmul_precision("high")
shapes = [(2048, 1024, 4096), (2048, 4096, 4096), (2048, 4096, 1000), (1024, 2048, 4096),
          (2048, 1000, 4096), (4096, 2048, 4096)]
for lib in ("default", "cublaslt"):
    torch.backends.cuda.preferred_blas_library(lib)
    for m, k, n in shapes:
        a = torch.randn(m, k, device="cuda"); b = torch.randn(k, n, device="cuda")
        o = torch.empty(m, n, device="cuda")
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for _ in range(2):
                torch.mm(a, b, out=o)
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            torch.mm(a, b, out=o)
        gr.replay(); torch.cuda.synchronize()
        recs = _trace_kernels(lambda: (gr.replay(), torch.cuda.synchronize()), 5)
        seq = call_sequence(recs)
        print(f"-- {lib} {m}x{k}x{n}:")
        print(format_sequence(seq))
PY
echo "gap rc $?"; grep -v "arn" $OUT/gap.log | cut -c1-200 | tail -90
grep -o 'label="[^"]*' $OUT/mlp_graph.dot 2>/dev/null | head -12 | cut -c1-600

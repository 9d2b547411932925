"""A small Triton kernel that a compile worker compiles once while it has nothing to do
(``compile_worker.warm_up``): the first compile in a process pays Triton's lazy start-up
(the backend's modules, MLIR's dialects, LLVM's NVPTX target, ptxas's version check), and a
worker started before its jobs are known pays it then instead of in its first job. The
result goes to a throwaway cache directory, never to the user's. Loaded by file path:
imports Triton only."""
import triton
import triton.language as tl


@triton.jit
def hlotk_warmup(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # A load, exp, a reduction and a masked store: the paths most of hlotk's kernels take.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + offs, e / tl.sum(e, axis=0), mask=offs < n)

"""Issue 13: the CUDA backend's CUDA C codegen time, deviceless. Each program is lowered and
compiled for the CUDA backend (target h200) under Triton's interpreter, where the backend
keeps Triton for every kernel (no GPU), so the loop fusions' CUDA C kernels are made here
as the backend makes them on a GPU: ``compile_loop_fusion`` with one build's memo (no
NVRTC: ``start=False``). Reported per program, medians of ``--repeat`` (GC off while timed):
loop fusions, emits with the memo, ms with the memo and ms emitting every fusion.

    PYTHONPATH=$PWD python benchmarks/cuda_c_emit_time.py [--only adam_step,...] [--repeat 7]
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, ".")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="adam_step,mlp_train,giou,transformer")
    ap.add_argument("--repeat", type=int, default=7)
    opts = ap.parse_args()
    os.environ["HLOTK_CACHE_DIR"] = tempfile.mkdtemp(prefix="hlotk-emit-")
    import runtime
    from benchmarks.compile_time import _program
    from codegen.cuda_c.emitter import CudaCDeclined, emit_loop_kernel
    from codegen.cuda_c.kernel import compile_loop_fusion
    from codegen.triton.kernel import classify
    print("| program | loop fusions | emits (memo) | memo ms | every fusion emitted ms |")
    print("|---|---|---|---|---|")
    for name in opts.only.split(","):
        fn, args = _program(name)[2:4]
        module = runtime.jit(fn, backend="cuda", target="h200").lower(*args).compile() \
            .executable.module
        fusions = [i for c in module.computations for i in c.instructions
                   if i.opcode == "fusion" and classify(i) == "loop"]
        memo: dict = {}

        def with_memo() -> None:
            memo.clear()
            for f in fusions:
                try:
                    compile_loop_fusion(f, arch="90", target="h200", start=False, memo=memo)
                except CudaCDeclined:
                    pass

        def every() -> None:
            for f in fusions:
                try:
                    emit_loop_kernel(f)
                except CudaCDeclined:
                    pass
        gc.disable()
        times = {}
        for label, work in (("memo", with_memo), ("every", every)):
            ts = []
            for _ in range(opts.repeat):
                t0 = time.perf_counter()
                work()
                ts.append(time.perf_counter() - t0)
            times[label] = 1e3 * statistics.median(ts)
        gc.enable()
        print(f"| {name} | {len(fusions)} | {len(memo)} | {times['memo']:.1f} | "
              f"{times['every']:.1f} |")


if __name__ == "__main__":
    main()

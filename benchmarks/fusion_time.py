"""Issue 13: the fusion pass alone, per program, deviceless (this CPU).

    PYTHONPATH=$PWD python benchmarks/fusion_time.py [--only adam_step,softmax] [--repeat 5]
        [--profile adam_step] [--json out.json] [--cpu]

Each program is lowered with no passes, run through the default CUDA pipeline (target h200)
up to the fusion pass, and the fusion pass is then timed alone on fresh copies of that
module (median of ``--repeat`` runs, the garbage collector off while timing so that a
collection triggered by earlier work is not charged to fusion). Programs: the GPU suite
and the held-out programs of ``passes_identity``.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

os.environ.setdefault("HLOTK_COMPILE_CACHE", "0")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def before_fusion(fn, args, x64: bool = False):
    """(module as the fusion pass receives it, the fusion pass object)."""
    import contextlib

    import jax

    import runtime
    from passes.fusion.pass_ import with_target
    from passes.pipeline import parse_pipeline
    from passes.pipelines import pipeline_spec
    from runtime.tools import compile_module
    with jax.enable_x64(True) if x64 else contextlib.nullcontext():
        module = runtime.jit(fn, pipeline="none").lower(*args).module
    spec = with_target(pipeline_spec("default", "cuda"), "h200")
    head, _, tail = spec.partition(",fusion{")
    fusion_spec = "fusion{" + tail.split("}", 1)[0] + "}"
    compile_module(module, head, backend="cuda")
    return module, fusion_spec


def time_fusion(module, fusion_spec: str, repeat: int, clock=time.perf_counter) -> list[float]:
    from runtime.tools import compile_module
    out = []
    for _ in range(repeat):
        m = module.clone()
        gc.collect()
        gc.disable()
        try:
            t0 = clock()
            compile_module(m, fusion_spec, backend="cuda")
            out.append(clock() - t0)
        finally:
            gc.enable()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", default="", help="cProfile the fusion pass of this program")
    ap.add_argument("--json", default="")
    ap.add_argument("--cpu", action="store_true",
                    help="the thread's CPU time instead of wall time (less disturbed by "
                         "other processes on a shared machine)")
    opts = ap.parse_args()
    from benchmarks.passes_identity import programs
    only = {s for s in opts.only.split(",") if s}
    if not only:
        only = {"softmax", "layernorm", "gelu_mlp", "s8_gemm", "giou", "int8_matmul",
                "transformer", "mlp_train", "adam_step", "attn_fwd", "attn_grad",
                "transformer_train", "heldout:llama_block", "heldout:rmsnorm_swiglu"}
    rows = {}
    for name, fn, args, x64 in programs(only):
        module, fspec = before_fusion(fn, args, x64)
        if opts.profile == name:
            import cProfile
            import pstats
            from runtime.tools import compile_module
            m = module.clone()
            gc.disable()
            pr = cProfile.Profile()
            pr.enable()
            compile_module(m, fspec, backend="cuda")
            pr.disable()
            gc.enable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(30)
            pstats.Stats(pr).sort_stats("cumtime").print_stats(40)
        times = time_fusion(module, fspec, opts.repeat,
                            time.thread_time if opts.cpu else time.perf_counter)
        med = sorted(times)[len(times) // 2]
        rows[name] = {"median_ms": round(med * 1e3, 2), "runs_ms": [round(t * 1e3, 2) for t in times],
                      "instructions": len(module.entry.instructions)}
        print(f"{name:28s} {len(module.entry.instructions):5d} inst  fusion median "
              f"{med * 1e3:8.2f} ms  {[round(t * 1e3, 1) for t in times]}", flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

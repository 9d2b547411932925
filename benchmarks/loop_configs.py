"""One loop kernel's device time per launch configuration, beside XLA's kernel (issue 12).

    PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu python3 -m benchmarks.loop_configs [--only giou]

For each gpu_suite program named, the single fusion of its deviceless CUDA compile (all
its operands entry parameters, as GIOU's) is generated three times: with minor-dim tiles
(codegen/triton/minor_tiles.py; stores marked one element per thread, and ``vstore``:
Triton's vector stores after a layout change) and without (``HLOTK_MINOR_TILES=0``), and launched directly
on the program's arguments with each of the loop template's candidate configurations and a
few more; CUPTI (torch.profiler) gives each kernel's duration, back-to-back launches, inputs
L2-warm. jax.jit's kernels for the same program are traced the same way, with their grid
and block sizes. Every launch's output is checked against jax.jit's result.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")

import numpy as np  # noqa: E402

CONFIGS = [(256, 2), (512, 4), (1024, 4), (2048, 8)]


def trace(run, n: int) -> list[dict]:
    """Kernel records (name, dur µs, grid, block, registers) of ``n`` calls of ``run``."""
    from benchmarks.kernel_profile import cuda_trace_events
    ev = cuda_trace_events(run, n, sync_each=False)
    return [{"name": e["name"], "dur": float(e.get("dur", 0.0)),
             "grid": e.get("args", {}).get("grid"), "block": e.get("args", {}).get("block"),
             "regs": e.get("args", {}).get("registers per thread")}
            for e in ev if e.get("cat") == "kernel" and e.get("ph") == "X"]


def summary(recs: list[dict]) -> str:
    by: dict = {}
    for r in recs:
        by.setdefault(r["name"], []).append(r)
    parts = []
    for name, rs in by.items():
        parts.append(f"{name[:48]} {statistics.median(r['dur'] for r in rs):.2f} µs "
                     f"grid {rs[0]['grid']} block {rs[0]['block']} regs {rs[0]['regs']}")
    return "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="giou")
    ap.add_argument("--launches", type=int, default=60)
    opts = ap.parse_args()
    import jax
    import torch
    import runtime
    from benchmarks.gpu_suite import programs, rel_err
    from codegen.triton import compile_fusion
    from passes.fusion.pass_ import with_target
    from passes.pipelines import pipeline_spec
    from runtime.tools import compile_module
    print(f"device {torch.cuda.get_device_name()}", flush=True)
    for name, label, fn, args, *_ in programs():
        if name not in opts.only.split(","):
            continue
        dev = jax.device_put(args)
        xc = jax.jit(fn).lower(*dev).compile()
        want = np.asarray(jax.block_until_ready(xc(*dev)))
        print(f"{name} XLA: {summary(trace(lambda: xc(*dev), opts.launches))}", flush=True)
        module = runtime.jit(fn, pipeline="none").lower(*args).module
        compile_module(module, with_target(pipeline_spec("default", "cuda"), "h200"),
                       backend="cuda")
        fusions = [i for i in module.entry.instructions if i.opcode == "fusion"]
        if len(fusions) != 1 or any(o.opcode != "parameter" for o in fusions[0].operands):
            print(f"{name}: not one fusion of entry parameters; skipped", flush=True)
            continue
        (f,) = fusions
        ins = [torch.from_numpy(np.asarray(args[o.parameter_number])).cuda() for o in f.operands]
        out = torch.empty(want.shape, dtype=ins[0].dtype, device="cuda")
        for side, flag in (("tiles", "1"), ("tiles, vector stores", "vstore"),
                           ("no tiles", "0")):
            os.environ["HLOTK_MINOR_TILES"] = flag
            k = compile_fusion(f, target="h200")
            for block, warps in CONFIGS:
                cfg = {"BLOCK": block, "num_warps": warps, "num_stages": 1}
                out.fill_(float("nan"))
                k.launch([out], ins, config=cfg)
                torch.cuda.synchronize()
                err = rel_err(out.cpu().numpy(), want)
                recs = trace(lambda: k.launch([out], ins, config=cfg), opts.launches)
                print(f"{name} {side} BLOCK {block} warps {warps}: err {err:.1e}; "
                      f"{summary(recs)}", flush=True)
        os.environ.pop("HLOTK_MINOR_TILES", None)


if __name__ == "__main__":
    main()

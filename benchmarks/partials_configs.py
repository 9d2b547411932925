"""Issue 13 (i13-triton-slow): what each tile of a program's split column-reduction partials
kernels costs to compile and to run (H200), to choose the default a first call compiles.

    PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu python3 -m benchmarks.partials_configs \
        [--program conv_bn_grad] [--template split_partials] [--min-us 4]
    (HLOTK_SPLIT_ACC_REGISTERS=0: the tiles before i13-split-tiles' accumulator bound are
    the defaults the rows start from)

The program is compiled by the CUDA backend (autotuning off: each kernel's default config);
for each kernel of the template predicted at ``--min-us`` or more, the tiles of its default
BLOCK_M at BLOCK_N / 1, 2, 4 and 4, 8, 16 warps (8 to 64 elements a thread) are compiled
one after another in this process (wall seconds of Triton's compile into a fresh cache, one
warm-up compile first; registers and spilled bytes as the loaded binary reports them) and
timed with ``triton.testing.do_bench`` (median, L2 flushed before each run) on inputs
|N(0,1)| + 0.1 (never zeros). Every config's outputs are checked against the default's.
Rows go to ``$OUT/partials_configs.json``.

Caveat (its one H200 run, i13-triton-slow): every tile of conv_bn_grad's two kernels timed
58-70 us, within the spread of a tile against itself, so the eager launch through
``TritonKernel.launch`` (Python) may set a floor under do_bench's numbers here; the compile
seconds, registers and spills are the reliable part. ``graph_us`` (i13-split-tiles): the
same launch replayed from a CUDA graph (``_graph_us``), without the eager launch's host cost.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, ".")
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="partials_configs_triton_")
os.environ.setdefault("HLOTK_CACHE_DIR", tempfile.mkdtemp(prefix="partials_configs_hlotk_"))
os.environ["HLOTK_AUTOTUNE"] = "0"

import numpy as np  # noqa: E402


def tiles(config: dict) -> list[dict]:
    """The default first, then BLOCK_N halved and quartered (at least 2) at 4, 8 and 16
    warps, 8 to 64 elements a thread."""
    out = [dict(config)]
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    for n in (bn, bn // 2, bn // 4):
        for w in (4, 8, 16):
            per = bm * n / (32 * w)
            cfg = dict(config, BLOCK_N=n, num_warps=w)
            if n >= 2 and 8 <= per <= 64 and cfg not in out:
                out.append(cfg)
    return out


def _binary_stats(kernel) -> dict:
    """Registers and spills of a compiled kernel (its handles loaded), where Triton says."""
    try:
        kernel._init_handles()
    except Exception:  # noqa: BLE001  (older Tritons load at the first launch)
        pass
    return {"regs": getattr(kernel, "n_regs", None), "spills": getattr(kernel, "n_spills", None)}


def _graph_us(k, outs: list, ins: list, cfg: dict, launches: int = 1) -> float | None:
    """Median microseconds of one launch of ``k`` at ``cfg`` replayed from a CUDA graph of
    ``launches`` launches (do_bench over the replays, L2 flushed before each; one launch by
    default: a second would find part of a 38 MB input in the 50 MB L2): the eager launch's
    host cost is gone, the graph launch's few microseconds stay, the same for every tile.
    None where the capture fails."""
    import torch
    import triton.testing
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(launches):
                k.launch(outs, ins, stream=torch.cuda.current_stream(), config=cfg)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        print(f"graph capture failed: {type(e).__name__}: {e}", flush=True)
        return None
    ms = triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median")
    return round(ms * 1e3 / launches, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--program", default="conv_bn_grad")
    ap.add_argument("--template", default="split_partials")
    ap.add_argument("--min-us", type=float, default=4.0)
    opts = ap.parse_args()
    import torch
    import triton
    import triton.testing

    import runtime
    from benchmarks.compile_time import _program
    from runtime.cuda import executable_of
    from runtime.cuda.arena import torch_dtype
    fn, args = _program(opts.program)[2:4]
    exe = executable_of(runtime.jit(fn, backend="cuda", target="h200").lower(*args).compile())
    kernels = [k for k in exe._triton_kernels()
               if k.template == opts.template and k.predicted_us >= opts.min_us]
    seen: set = set()
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    warm = True
    for k in kernels:
        if k.key in seen:
            continue
        seen.add(k.key)
        ins = [(torch.randn(tuple(s.dims), device="cuda", generator=gen).abs() + 0.1)
               .to(torch_dtype(s.dtype)) for s in k.input_shapes]
        outs = [torch.empty(tuple(s.dims), device="cuda", dtype=torch_dtype(s.dtype))
                for s in k.output_shapes]
        call_args = k._args(outs, ins)
        ref = None
        for cfg in tiles(k.config):
            c = dict(cfg)
            warps, stages = c.pop("num_warps", 4), c.pop("num_stages", 1)
            if warm:       # Triton's once-per-process compile costs, outside the rows
                k.fn.warmup(*call_args, grid=k.plan.grid(dict(c)), **dict(c, BLOCK_N=2),
                            num_warps=4, num_stages=1)
                warm = False
            t0 = time.perf_counter()
            compiled = k.fn.warmup(*call_args, grid=k.plan.grid(dict(c)), **c,
                                   num_warps=warps, num_stages=stages)
            compile_s = time.perf_counter() - t0
            for o in outs:
                o.fill_(float("nan"))
            k.launch(outs, ins, config=cfg)
            torch.cuda.synchronize()
            got = [o.float().cpu().numpy().copy() for o in outs]
            if ref is None:
                ref = got
            err = max(float(np.max(np.abs(g - r)) / max(1e-30, float(np.max(np.abs(r)))))
                      for g, r in zip(got, ref))
            ms = triton.testing.do_bench(lambda: k.launch(outs, ins, config=cfg), warmup=10,
                                         rep=100, return_mode="median")
            gus = _graph_us(k, outs, ins, cfg)
            row = {"program": opts.program, "kernel": k.name, "config": cfg,
                   "default": cfg == k.config, "compile_s": round(compile_s, 4),
                   "us": round(ms * 1e3, 2), "graph_us": gus, "rel_err": err,
                   "predicted_us": k.predicted_us,
                   "per_thread": cfg["BLOCK_M"] * cfg["BLOCK_N"] / (32 * warps),
                   **_binary_stats(compiled)}
            rows.append(row)
            print(f"| {k.name} | {json.dumps(cfg)} | {'*' if row['default'] else ''} | "
                  f"{compile_s:.3f} | {row['regs']} / {row['spills']} | {ms * 1e3:.2f} | "
                  f"{gus} | {err:.1e} |", flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "partials_configs.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"triton {triton.__version__}, {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()

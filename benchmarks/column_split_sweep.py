"""Split column reductions on the GPU (issue 14): each split reduction of a program timed
as a CUDA-graph replay of its two kernels (as the executable runs them), then, with
``--sweep``, the same fusion cut other ways (parts, rows per step, warps), each checked
against the default's result; with ``--step``, the whole training step's device time per
kernel from CUPTI (``kernel_profile.kernel_table``, jax.jit beside it).

Runs against whatever code is first on ``sys.path`` (the current directory), so the same
file times main's kernels from main's checkout:

    PYTHONPATH=$PWD python3 path/to/column_split_sweep.py --programs mlp_train --tag main

Prints one JSON line per measurement (``--jsonl`` appends them to a file)."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")
os.environ.setdefault("HLOTK_AUTOTUNE", "0")

# Kernels worth timing besides the splits (mlp_train's one-hot gradient: 15.2 us eager in
# the committed table, 4.7 us inside the step's graph).
EXTRA = ("fused_iota_compare_convert_multiply",)
DEVICE = "cuda"      # (a CPU check of the sweep's plumbing sets "cpu", interpreter mode)


def _emit(row: dict, jsonl: str) -> None:
    print(json.dumps(row, default=str), flush=True)
    if jsonl:
        with open(jsonl, "a") as fh:
            fh.write(json.dumps(row, default=str) + "\n")


def _program(name: str):
    from benchmarks.reductions import programs
    for group, pname, fn, args, _scope in programs({"suite", "issue14"}):
        if pname == name:
            return fn, args
    raise SystemExit(f"unknown program {name!r}")


def _graph_us(run) -> float:
    """do_bench median (L2 flushed before each replay) of ``run`` captured in a graph."""
    from benchmarks.gpu_suite import bench
    from benchmarks.kernel_profile import capture_graph
    return bench(capture_graph(run).replay, rep=100) * 1e3


def _tensors(group):
    """Random inputs and the output buffers of a kernel group, keyed by slot."""
    import numpy as np
    from benchmarks.reductions import _tensor
    rng = np.random.default_rng(0)
    cache: dict = {}

    def get(slot):
        key = (slot.allocation, slot.offset, tuple(slot.shape.dims), slot.shape.dtype.name)
        if key not in cache:
            cache[key] = _tensor(slot.shape, rng, DEVICE)
        return cache[key]
    return get


def sweep_group(group, variants: list[tuple], tag: str, program: str,
                jsonl: str, deadline: float = math.inf) -> None:
    """Time ``group``'s fusion split as each (parts, block_n, warps[, block_m]) in
    ``variants`` (until ``deadline``, a perf_counter time)."""
    import torch
    from codegen.triton import compile_fusion
    from codegen.triton.reductions import Split, analyze, finish_fusion, split_of, split_outputs
    from runtime.cuda.arena import torch_dtype
    from runtime.cuda.thunks import one_instruction_fusion
    inst = group[0].inst
    fusion = inst if inst.opcode == "fusion" else one_instruction_fusion(inst)
    comp = fusion.attrs["calls"]
    a = analyze(comp)
    default = split_of(comp)
    get = _tensors(group)
    ins = [get(s) for s in group[0].inputs]
    full_k, kept_k = split_outputs(comp)
    n_part = len(group[0].outputs) - len(full_k)
    full_outs = [get(s) for s in group[0].outputs[n_part:]]
    want = [get(s) for s in group[-1].outputs]
    for k, o, i in [(t.kernel, [get(s) for s in t.outputs], [get(s) for s in t.inputs]) for t in group]:
        k.launch(o, i)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    want = [w.clone() for w in want]
    if a.R <= 2048:
        # the unsplit column kernel (one program per BLOCK_M kept elements)
        row = {"tag": tag, "program": program, "kernel": group[0].kernel.name, "kind": "sweep",
               "parts": 1, "variant": "column_onepass"}
        try:
            one = compile_fusion(fusion, target=group[0].kernel.target, autotune=0)
            outs = [torch.empty_like(w) for w in want]
            all_outs = []
            it_full, it_kept = iter(full_outs), iter(outs)
            for kind in a.out_kind:
                all_outs.append(next(it_full) if kind == "full" else next(it_kept))
            row.update(template=one.template, config=dict(one.config),
                       grid=list(one.plan.grid(dict(one.config))))
            row["us"] = _graph_us(lambda: one.launch(all_outs, ins))
            row["max_rel_err"] = max(float((o.double() - w.double()).abs().max()
                                           / max(float(w.double().abs().max()), 1e-30))
                                     for o, w in zip(outs, want))
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        _emit(row, jsonl)
    for variant in variants:
        parts, bn, warps = variant[:3]
        bm = variant[3] if len(variant) > 3 else (default.block_m if default else 1024)
        if time.perf_counter() > deadline:
            print(f"# sweep budget spent: {len(variants)} variants asked", flush=True)
            return
        chunk = -(-a.R // parts)
        chunk = -(-chunk // bn) * bn
        real_parts = -(-a.R // chunk)
        sp = Split(real_parts, chunk, bm, bn)
        row = {"tag": tag, "program": program, "kernel": group[0].kernel.name, "kind": "sweep",
               "parts": real_parts, "chunk": chunk, "block_m": sp.block_m, "block_n": bn,
               "warps": warps, "default": bool(default and (default.parts, default.block_n)
                                               == (real_parts, bn))}
        try:
            part = compile_fusion(fusion, target=group[0].kernel.target, autotune=0, split=sp)
            fin = compile_fusion(finish_fusion(fusion, sp), target=group[0].kernel.target, autotune=0)
            partials = [torch.empty(tuple(s.dims), device=DEVICE, dtype=torch_dtype(s.dtype))
                        for s in part.output_shapes[:len(part.output_shapes) - len(full_k)]]
            outs = [torch.empty_like(w) for w in want]
            cfg = dict(part.config, num_warps=warps)

            def run():
                part.launch(partials + full_outs, ins, config=cfg)
                fin.launch(outs, ins + partials)
            row["us"] = _graph_us(run)
            row["max_rel_err"] = max(float((o.double() - w.double()).abs().max()
                                           / max(float(w.double().abs().max()), 1e-30))
                                     for o, w in zip(outs, want))
        except Exception as e:  # noqa: BLE001  (one variant's failure is a line)
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        _emit(row, jsonl)


def variants_for(group) -> list[tuple[int, int, int]]:
    from codegen.triton.reductions import analyze
    inst = group[0].inst
    comp = inst.attrs["calls"] if inst.opcode == "fusion" else None
    if comp is None:
        from runtime.cuda.thunks import one_instruction_fusion
        comp = one_instruction_fusion(inst).attrs["calls"]
    a = analyze(comp)
    if a.M <= 1024 and a.R <= 2048:   # mlp_train's bias gradient: one band of 1000
        return [(64, 8, 8), (128, 8, 8), (256, 8, 8), (128, 4, 4), (256, 4, 4), (256, 4, 8),
                (512, 4, 4)]
    if a.M <= 1024:                   # layer-norm weight gradients over 8192 tokens
        # 16 rows per step: twice the bytes in flight per program (the bf16 split ran at
        # 59% of a same-size copy with 8)
        # and column strips of 256-512 bytes instead of whole rows (the comment in
        # split_of calls them slow, from eager timings)
        return [(256, 8, 8), (256, 16, 8), (128, 16, 16), (64, 32, 8, 256), (64, 64, 8, 128),
                (128, 8, 8), (512, 4, 4)]
    return [(128, 4, 8), (64, 4, 8), (256, 4, 8), (128, 4, 4)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", default="mlp_train,transformer_train")
    ap.add_argument("--tag", default="branch")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-budget", type=float, default=40.0, help="seconds for all sweeps")
    ap.add_argument("--step", default="", help="programs whose whole step is profiled")
    ap.add_argument("--jsonl", default="")
    opts = ap.parse_args()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import torch
    import runtime
    from benchmarks.gpu_suite import ceilings_copy
    from benchmarks.reductions import reduction_groups, time_group
    try:
        from benchmarks.reductions import minimal_bytes
    except ImportError:          # main before i14-colred
        def minimal_bytes(g):
            from benchmarks.reductions import _nbytes
            return sum(_nbytes(s.shape) for s in g[0].inputs)
    from runtime.cuda import executable_of
    ceil = ceilings_copy()
    deadline = time.perf_counter() + opts.sweep_budget
    swept: set = set()
    print(f"# {opts.tag}: copy {ceil / 1e9:.0f} GB/s on {torch.cuda.get_device_name()}", flush=True)
    for name in [p for p in opts.programs.split(",") if p]:
        t0 = time.perf_counter()
        try:
            fn, args = _program(name)
            exe = executable_of(runtime.jit(fn, backend="cuda").lower(*args).compile())
            seen: set = set()
            for g in reduction_groups(exe):
                key = tuple(t.kernel.key for t in g)
                split = "split_partials" in g[0].kernel.template
                column = (g[0].kernel.template == "column_onepass"
                          and minimal_bytes(g) >= 4 << 20)      # e.g. an unsplit bias gradient
                if key in seen or not (split or column or g[0].kernel.name in EXTRA):
                    continue
                seen.add(key)
                row = time_group(g, ceil, False)
                row.update(tag=opts.tag, program=name, kind="default")
                _emit(row, opts.jsonl)
                what = (g[0].kernel.name, tuple(str(s.shape) for s in g[0].inputs))
                if split and opts.sweep and what not in swept:
                    swept.add(what)
                    sweep_group(g, variants_for(g), opts.tag, name, opts.jsonl, deadline)
            del exe
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            print(f"{name}: {type(e).__name__}: {e}"[:300], flush=True)
        print(f"# {opts.tag} {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    for name in [p for p in opts.step.split(",") if p]:
        from benchmarks.kernel_profile import format_table, kernel_table
        fn, args = _program(name)
        res = kernel_table(fn, args, steps=5)
        print(format_table(res, top=12), flush=True)
        for side in ("hlotk", "xla"):
            r = res[side]
            _emit({"tag": opts.tag, "program": name, "kind": "step", "side": side,
                   "sum_us": r["sum_us"], "span_us": r["span_us"], "launches": r["launches"],
                   "kernels": [(k["name"], round(k["us"], 2), k["calls"]) for k in r["kernels"][:40]]},
                  opts.jsonl)


if __name__ == "__main__":
    main()

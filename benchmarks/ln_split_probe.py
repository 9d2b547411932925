"""Why transformer_train's split layer-norm weight gradients run under 70% of a same-size
copy (issue 14), on the GPU. Two small programs whose hlotk kernels are those of the step
(same fusion, template, config and grid; checked without a GPU):

- ``ln_wgrad``: sum(dy), sum((x - mean) * rstd * dy) over 8192 tokens, bf16 [4,2048,1024]
- ``resid_grad``: sum(s), sum(d * s), s = a + b + c (bf16), d f32 [4,2048,1024]

For each: the default split (partials + finish) as a CUDA-graph replay (do_bench, L2
flushed by writes), each of its two kernels alone, variants of the split (parts, rows per
step, warps, strip width), the same-size copy and a
read-only reference (torch's sum over the same input bytes); then the copy, the read and
the default again with the L2 flushed by *reads* (no dirty lines left to write back
while the kernel runs); last, CUPTI kernel durations of hlotk's and XLA's kernels.

    PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu python3 benchmarks/ln_split_probe.py --jsonl out.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")
os.environ.setdefault("HLOTK_AUTOTUNE", "0")

SHAPE = (4, 2048, 1024)
DEV = "cuda"          # (a CPU check of the plumbing sets "cpu", interpreter mode)


def ln_wgrad(x, mean, rstd, dy):
    import jax.numpy as jnp
    dyf = dy.astype(jnp.float32)
    return dyf.sum((0, 1)), (((x.astype(jnp.float32) - mean) * rstd) * dyf).sum((0, 1))


def resid_grad(a, b, c, d):
    import jax.numpy as jnp
    s = ((a + b) + c).astype(jnp.float32)
    return s.sum((0, 1)), (d * s).sum((0, 1))


def cases() -> list[tuple[str, object, tuple]]:
    import jax.numpy as jnp
    import numpy as np
    r = np.random.default_rng(0)

    def bf(*s):
        return r.standard_normal(s).astype(jnp.bfloat16)

    def fl(*s):
        return r.standard_normal(s).astype(np.float32)
    b, s, d = SHAPE
    return [("ln_wgrad", ln_wgrad, (bf(b, s, d), fl(b, s, 1), fl(b, s, 1), bf(b, s, d))),
            ("resid_grad", resid_grad, (bf(b, s, d), bf(b, s, d), bf(b, s, d), fl(b, s, d)))]


# (parts, rows per step, warps, kept elements per tile). Run at 949071c also with sums
# folded per step into [BLOCK_M, 1] accumulators (Split.fold, removed since: 40% slower).
VARIANTS = [
    (256, 8, 8, 1024),    # the default (main's kernel): 2 programs/SM, 64 KiB/SM in flight (bf16)
    (128, 8, 8, 1024),    # 1 program/SM, 8 steps
    (512, 8, 8, 1024),    # two waves of 2/SM, 2 steps
    (64, 32, 8, 256),     # 512-byte strips, 4 x 64 programs
]


ONEPASS = False


def _emit(row: dict, jsonl: str) -> None:
    print(json.dumps(row, default=str), flush=True)
    if jsonl:
        with open(jsonl, "a") as fh:
            fh.write(json.dumps(row, default=str) + "\n")


def _fill(row: dict, key: str, measure) -> None:
    """row[key] = measure(), or the error under key + "_error" (one failure is a field)."""
    try:
        row[key] = measure()
    except Exception as e:  # noqa: BLE001
        row[key + "_error"] = f"{type(e).__name__}: {e}"[:200]


def _graph(run):
    from benchmarks.kernel_profile import capture_graph
    return capture_graph(run)


def replay_us(run) -> float:
    """do_bench median (its L2 flush writes 256 MB: the L2 starts full of dirty lines)."""
    from benchmarks.gpu_suite import bench
    return bench(_graph(run).replay, rep=100) * 1e3


_FLUSH: list = []


def clean_replay_us(run, reps: int = 60) -> float:
    """Median of event-timed graph replays, each after a 256 MB *read* (the L2 holds no
    dirty lines when the replay starts)."""
    import statistics
    import torch
    g = _graph(run)
    if not _FLUSH:
        _FLUSH.append(torch.ones(64 << 20, dtype=torch.float32, device="cuda"))
    ts = []
    for _ in range(reps):
        torch.sum(_FLUSH[0])
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def copy_run(nbytes: int):
    import torch
    a = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    return lambda: b.copy_(a)


def read_run(nbytes: int):
    """torch's sum over ``nbytes`` of f32 (a read-only kernel near read bandwidth)."""
    import torch
    x = torch.randn(nbytes // 4, device="cuda")
    return lambda: torch.sum(x)


def probe(name: str, fn, args, jsonl: str, deadline: float) -> None:
    import torch
    import runtime
    from benchmarks.column_split_sweep import _tensors
    from benchmarks.reductions import minimal_bytes, reduction_groups
    from codegen.triton import compile_fusion
    from codegen.triton.reductions import Split, analyze, finish_fusion, split_outputs
    from runtime.cuda import executable_of
    from runtime.cuda.arena import torch_dtype
    exe = executable_of(runtime.jit(fn, backend="cuda").lower(*args).compile())
    group = [g for g in reduction_groups(exe) if "split_partials" in g[0].kernel.template][0]
    import benchmarks.column_split_sweep as css
    css.DEVICE = DEV
    get = _tensors(group)
    ins = [get(s) for s in group[0].inputs]
    parts_out = [get(s) for s in group[0].outputs]
    outs = [get(s) for s in group[-1].outputs]
    launches = [(t.kernel, [get(s) for s in t.outputs], [get(s) for s in t.inputs]) for t in group]

    def run():
        for k, o, i in launches:
            k.launch(o, i)
    nbytes = minimal_bytes(group)
    base = {"case": name, "bytes": nbytes, "device": torch.cuda.get_device_name()}
    row = dict(base, what="default", kernels=[t.kernel.name for t in group],
               config=dict(group[0].kernel.config), grid=[list(t.kernel.grid) for t in group])
    k0, o0, i0 = launches[0]
    k1, o1, i1 = launches[1]
    _fill(row, "us", lambda: replay_us(run))
    _fill(row, "copy_us", lambda: replay_us(copy_run(nbytes)))
    _fill(row, "read_us", lambda: replay_us(read_run(nbytes)))
    _fill(row, "partials_only_us", lambda: replay_us(lambda: k0.launch(o0, i0)))
    _fill(row, "finish_only_us", lambda: replay_us(lambda: k1.launch(o1, i1)))
    _fill(row, "vs_copy", lambda: row["copy_us"] / row["us"])
    _emit(row, jsonl)
    want = [o.clone() for o in outs]
    del parts_out
    inst = group[0].inst
    comp = inst.attrs["calls"]
    a = analyze(comp)
    full_k, _ = split_outputs(comp)
    for parts, bn, warps, bm in VARIANTS:
        if time.perf_counter() > deadline:
            print(f"# {name}: variant budget spent", flush=True)
            break
        chunk = -(-a.R // parts)
        chunk = -(-chunk // bn) * bn
        real = -(-a.R // chunk)
        sp = Split(real, chunk, bm, bn)
        r = dict(base, what="variant", parts=real, chunk=chunk, block_n=bn, warps=warps,
                 block_m=bm)
        try:
            part = compile_fusion(inst, target=group[0].kernel.target, autotune=0, split=sp)
            fin = compile_fusion(finish_fusion(inst, sp), target=group[0].kernel.target, autotune=0)
            partials = [torch.empty(tuple(s.dims), device=DEV, dtype=torch_dtype(s.dtype))
                        for s in part.output_shapes[:len(part.output_shapes) - len(full_k)]]
            got = [torch.empty_like(w) for w in want]
            cfg = dict(part.config, num_warps=warps)
            r["same_source_as_default"] = getattr(part, "source", 0) == getattr(group[0].kernel, "source", 1)

            def vrun():
                part.launch(partials, ins, config=cfg)
                fin.launch(got, ins + partials)
            r["us"] = replay_us(vrun)
            r["partials_only_us"] = replay_us(lambda: part.launch(partials, ins, config=cfg))
            r["max_rel_err"] = max(float((o.double() - w.double()).abs().max()
                                         / max(float(w.double().abs().max()), 1e-30))
                                   for o, w in zip(got, want))
            r["vs_copy"] = row["copy_us"] / r["us"]
        except Exception as e:  # noqa: BLE001  (one variant's failure is a line)
            r["error"] = f"{type(e).__name__}: {e}"[:300]
        _emit(r, jsonl)
    if ONEPASS:
        # one launch: the unsplit column kernel (64 programs of 16 kept elements here)
        r = dict(base, what="column_onepass")
        try:
            one = compile_fusion(inst, target=group[0].kernel.target, autotune=0)
            got = [torch.empty_like(w) for w in want]
            r.update(config=dict(one.config), grid=list(one.plan.grid(dict(one.config))))
            r["us"] = replay_us(lambda: one.launch(got, ins))
            r["max_rel_err"] = max(float((o.double() - w.double()).abs().max()
                                         / max(float(w.double().abs().max()), 1e-30))
                                   for o, w in zip(got, want))
        except Exception as e:  # noqa: BLE001
            r["error"] = f"{type(e).__name__}: {e}"[:300]
        _emit(r, jsonl)
    # the L2 flushed by reads: no dirty lines to write back under the kernel
    c = dict(base, what="clean_l2")
    _fill(c, "us", lambda: clean_replay_us(run))
    _fill(c, "copy_us", lambda: clean_replay_us(copy_run(nbytes)))
    _fill(c, "read_us", lambda: clean_replay_us(read_run(nbytes)))
    _fill(c, "partials_only_us", lambda: clean_replay_us(lambda: k0.launch(o0, i0)))
    _fill(c, "vs_copy", lambda: c["copy_us"] / c["us"])
    _emit(c, jsonl)
    del exe


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jsonl", default="")
    ap.add_argument("--budget", type=float, default=90.0, help="seconds for the variants of each case")
    ap.add_argument("--cupti", action="store_true", help="only CUPTI kernel times, hlotk and XLA")
    ap.add_argument("--onepass", action="store_true", help="also the unsplit column kernel")
    opts = ap.parse_args()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    global ONEPASS
    ONEPASS = opts.onepass
    for name, fn, args in ([] if opts.cupti else cases()):
        t0 = time.perf_counter()
        try:
            probe(name, fn, args, opts.jsonl, t0 + opts.budget)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            print(f"{name}: {type(e).__name__}: {e}"[:300], flush=True)
        print(f"# {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    if opts.cupti:
        from benchmarks.kernel_profile import kernel_table
        for name, fn, args in cases():
            try:
                res = kernel_table(fn, args, steps=5)
                for side in ("hlotk", "xla"):
                    s = res[side]
                    _emit({"case": name, "what": "cupti", "side": side, "sum_us": s["sum_us"],
                           "span_us": s["span_us"],
                           "kernels": [(k["name"], round(k["us"], 2), k["calls"])
                                       for k in s["kernels"][:6]]}, opts.jsonl)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                print(f"cupti {name}: {type(e).__name__}: {e}"[:300], flush=True)


if __name__ == "__main__":
    main()

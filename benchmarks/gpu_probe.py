"""Diagnostics behind gpu_suite's ratios (run on the GPU machine; numbers in NOTES.md).

    python -m benchmarks.gpu_probe [--out DIR]

1. Host time per call: the programs of gpu_suite that are host-bound (softmax, GIOU, a
   16-element add), hlotk vs jax.jit wall per call, and a cProfile of 2000 hlotk calls
   (where the Python time goes), plus the executable's graph counters (replays vs eager).
2. The int8 GEMM: the generated Triton kernel for s8[8192,8192] x s8[8192,8192] -> s32 with
   the rhs N-major (row-major, as before) and K-major (what layout assignment now asks for),
   over the template's candidate configs: TOPS per config.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats

import numpy as np


def bench(fn, rep: int = 200) -> float:
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def host_overhead(out: list[str]) -> None:
    import jax
    import runtime
    from runtime.cuda import executable_of
    from benchmarks.gpu_suite import programs
    progs = {p[0]: p for p in programs()}
    cases = [("tiny_add", lambda x: x + 1.0, (np.ones(16, np.float32),))]
    for name in ("softmax", "giou", "s8_gemm", "mlp_train"):
        if name in progs:
            cases.append((name, progs[name][2], progs[name][3]))
    for name, fn, args in cases:
        dev_args = jax.device_put(args)
        xc = jax.jit(fn).lower(*dev_args).compile()
        hc = runtime.jit(fn, backend="cuda").lower(*dev_args).compile()
        exe = executable_of(hc)
        for _ in range(5):
            jax.block_until_ready(hc(*dev_args))
        exe.stats.clear()
        xla = bench(lambda: jax.block_until_ready(xc(*dev_args)))
        ours = bench(lambda: jax.block_until_ready(hc(*dev_args)))
        stats = dict(exe.stats)
        from benchmarks.gpu_suite import wall_ms
        xla_cold = wall_ms(lambda: jax.block_until_ready(xc(*dev_args)))
        ours_cold = wall_ms(lambda: jax.block_until_ready(hc(*dev_args)))
        flat = list(jax.tree_util.tree_leaves(dev_args))
        import torch
        ours_torch = wall_ms(lambda: (exe.run(flat, output="torch"), torch.cuda.synchronize()))
        out.append(_phases(exe, flat))
        from runtime.cuda.arena import DLPACK_FALLBACK
        out.append(f"jax devices {jax.devices()}; DLPack fallbacks {DLPACK_FALLBACK}\n")
        out.append(f"## {name}: do_bench hlotk {ours:.4f} ms, XLA {xla:.4f} ms per call; cold "
                   f"wall hlotk {ours_cold:.4f}, XLA {xla_cold:.4f}, hlotk run(torch) + "
                   f"synchronize {ours_torch:.4f}; counters over the timed calls: {stats}\n")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            jax.block_until_ready(hc(*dev_args))
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        out += ["```", s.getvalue()[-6000:], "```", ""]
        print(out[-4][:200], flush=True)


def _phases(exe, flat: list, calls: int = 300) -> str:
    """Median host time of each step of ``CudaExecutable.run`` (the same steps, timed one
    by one) and of the wait, from an idle GPU."""
    import statistics
    import time
    import jax
    import torch
    from runtime.cuda import arena as ar
    from runtime.cuda.thunks import RunContext
    names = ("memory (args, pooled outputs)", "thunks (graph replay)", "output views",
             "handoff event", "DLPack exports", "keep-alive", "block_until_ready")
    steps: list[list[float]] = [[] for _ in names]
    for _ in range(calls):
        torch.cuda.synchronize()
        t = [time.perf_counter()]
        mem = exe.memory(list(flat))
        t.append(time.perf_counter())
        ctx = RunContext(exe._eval_context(), exe.stats)
        ctx.graphs = exe.graphs
        exe.sequence.run(mem, ctx)
        t.append(time.perf_counter())
        views = [mem.view(slot) for slot in exe.output_slots]
        t.append(time.perf_counter())
        handoff = ar.jax_handoff(exe.device)
        event = handoff.begin()
        t.append(time.perf_counter())
        res = [ar.to_jax(v, slot.shape, handoff) for v, slot in zip(views, exe.output_slots)]
        t.append(time.perf_counter())
        exe._keep_alive(mem, event)
        t.append(time.perf_counter())
        jax.block_until_ready(res)
        t.append(time.perf_counter())
        for k in range(len(names)):
            steps[k].append((t[k + 1] - t[k]) * 1e6)
        del res, mem
    return "host steps of one call (median us): " + ", ".join(
        f"{n} {statistics.median(v):.1f}" for n, v in zip(names, steps)) + "\n"


def dlpack_steps(out: list[str], calls: int = 2000) -> None:
    """The pieces of handing a torch result to JAX, each timed alone (us per call)."""
    import time
    import jax
    import torch
    from torch.utils.dlpack import to_dlpack
    from runtime.cuda.arena import JaxHandoff
    h = JaxHandoff.for_device(torch.device("cuda", 0))
    t = torch.ones(16, device="cuda")
    keep = []

    def per_call(fn) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            keep.append(fn())
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / calls * 1e6
        keep.clear()
        return dt
    ev = torch.cuda.Event()
    ev.record()
    rows = {
        "torch.cuda.current_stream(dev)": lambda: torch.cuda.current_stream(h.device),
        "Event() + record(stream)": lambda: torch.cuda.Event().record(
            torch.cuda.current_stream(h.device)),
        "external.wait_event": lambda: h.external.wait_event(ev),
        "to_dlpack": lambda: to_dlpack(t),
        "convert, stream given": lambda: h.convert(to_dlpack(t), h.jax_device, h.stream, None,
                                                   h.dl_type),
        "convert, no stream": lambda: h.convert(to_dlpack(t), h.jax_device, None, None,
                                                h.dl_type),
        "t.__dlpack__(stream) + convert": lambda: h.convert(t.__dlpack__(stream=h.stream),
                                                            h.jax_device, h.stream, None,
                                                            h.dl_type),
        "jax.dlpack.from_dlpack(t)": lambda: jax.dlpack.from_dlpack(t),
        "jnp.zeros(16) (a JAX dispatch)": lambda: jax.numpy.zeros(16),
    }
    out.append("## DLPack handoff pieces (us per call, host clock)\n")
    for name, fn in rows.items():
        try:
            out.append(f"- {name}: {per_call(fn):.1f}")
        except Exception as e:  # noqa: BLE001
            out.append(f"- {name}: failed {type(e).__name__}: {e}")
        print(out[-1], flush=True)


def output_release(out: list[str]) -> None:
    """How long after the caller drops a result until the output pool sees its set free
    (JAX releases a DLPack-imported buffer asynchronously), with and without gc.collect()."""
    import gc
    import time
    import jax
    import runtime
    from runtime.cuda import executable_of
    x = jax.device_put(np.ones((8192, 4096), np.float32))
    hc = runtime.jit(lambda v: jax.nn.softmax(v, axis=-1), backend="cuda").lower(x).compile()
    exe = executable_of(hc)
    pool = exe._outputs
    waits = []
    for trial in range(20):
        r = hc(x)
        jax.block_until_ready(r)
        ptr = r.unsafe_buffer_pointer()
        owner = next(s for s in pool.sets if any(t.data_ptr() == ptr for t, _ in s.values()))
        del r
        t0 = time.perf_counter()
        collected = False
        while not all(pool._refs(t) == base for t, base in owner.values()):
            if time.perf_counter() - t0 > 0.01 and not collected:
                gc.collect()
                collected = True
            if time.perf_counter() - t0 > 0.2:
                break
            time.sleep(1e-5)
        waits.append(((time.perf_counter() - t0) * 1e3, collected))
    out.append(f"## output pool: ms until a dropped result's set is free (gc.collect() after "
               f"10 ms if needed): {[(round(w, 3), c) for w, c in waits]}; stats {exe.stats}\n")
    print(out[-1], flush=True)


def waiting(out: list[str]) -> None:
    """The same calls timed three ways: waiting with jax.block_until_ready on the DLPack
    result, with torch.cuda.synchronize(), and through exe.run(output="torch") + synchronize:
    whether the gap between wall and device time is in how the result is waited for."""
    import jax
    import torch
    import runtime
    from runtime.cuda import executable_of
    from benchmarks.gpu_suite import programs
    progs = {p[0]: p for p in programs()}
    out.append("## waiting for results (ms per call)\n")
    out.append("| program | block_until_ready | cuda.synchronize | exe.run(torch) + sync | "
               "graph replay alone |")
    out.append("|---|---|---|---|---|")
    for name in ("int8_matmul", "gelu_mlp", "mlp_train"):
        fn, args = progs[name][2], progs[name][3]
        dev_args = jax.device_put(args)
        hc = runtime.jit(fn, backend="cuda").lower(*dev_args).compile()
        exe = executable_of(hc)
        flat = list(jax.tree_util.tree_leaves(dev_args))
        for _ in range(5):
            jax.block_until_ready(hc(*dev_args))
        a = bench(lambda: jax.block_until_ready(hc(*dev_args)))
        b = bench(lambda: (hc(*dev_args), torch.cuda.synchronize()))
        c = bench(lambda: (exe.run(flat, output="torch"), torch.cuda.synchronize()))
        replay = sum(bench(next(reversed(seg.graphs.values())).replay, rep=100)
                     for seg in exe.graph_segments() if seg.graphs)
        out.append(f"| {name} | {a:.3f} | {b:.3f} | {c:.3f} | {replay:.3f} |")
        print(out[-1], flush=True)


def _gpu_timeline(trace_path: str, marks: list[str]) -> list[dict]:
    """Per marked call in a torch.profiler chrome trace: host span, the GPU's first and last
    activity inside it (relative to the call's start), busy time and the largest idle gap."""
    import json
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    gpu = sorted((e["ts"], e["ts"] + e.get("dur", 0), e.get("name", "")) for e in events
                 if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "ts" in e)
    rows = []
    for m in marks:
        host = [e for e in events if e.get("name") == m and e.get("cat") == "user_annotation"]
        if not host:
            continue
        h0, h1 = host[0]["ts"], host[0]["ts"] + host[0]["dur"]
        inside = [g for g in gpu if h0 <= g[0] < h1]
        if not inside:
            rows.append({"call": m, "host_us": h1 - h0})
            continue
        busy, gap, end = 0.0, 0.0, inside[0][0]
        for s, e, _ in inside:
            gap = max(gap, s - end)
            busy += max(0.0, e - max(s, end))
            end = max(end, e)
        rows.append({"call": m, "host_us": h1 - h0, "first_gpu_us": inside[0][0] - h0,
                     "gpu_span_us": end - inside[0][0], "busy_us": busy,
                     "max_gap_us": gap, "after_last_us": h1 - end, "n_gpu": len(inside),
                     "kernels": [(n, e - s) for s, e, n in inside]})
    return rows


def timeline(out: list[str], trace_dir: str = ".",
             names: tuple[str, ...] = ("mlp_train", "gelu_mlp", "int8_matmul")) -> None:
    """Where a call's wall time goes, from a torch.profiler (CUPTI) trace of XLA's and
    hlotk's calls of the same programs, and their walls timed with perf_counter (no L2
    flush between calls, unlike do_bench, whose flush runs on torch's stream and can
    overlap XLA's work on JAX's stream)."""
    import statistics
    import time
    import jax
    import torch
    import runtime
    from benchmarks.gpu_suite import programs
    progs = {p[0]: p for p in programs()}
    out.append("## call timelines (us; medians over 5 profiled calls)\n")
    out.append("| program | who | perf_counter ms | do_bench ms | host span | first GPU op | "
               "GPU span | GPU busy | largest gap | after last GPU op |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    kernel_lists: list[str] = []
    for name in names:
        fn, args = progs[name][2], progs[name][3]
        dev_args = jax.device_put(args)
        jax.block_until_ready(dev_args)
        xc = jax.jit(fn).lower(*dev_args).compile()
        hc = runtime.jit(fn, backend="cuda").lower(*dev_args).compile()
        for who, f in (("XLA", xc), ("hlotk", hc)):
            for _ in range(5):
                jax.block_until_ready(f(*dev_args))
            walls = []
            for _ in range(50):
                t0 = time.perf_counter()
                jax.block_until_ready(f(*dev_args))
                walls.append((time.perf_counter() - t0) * 1e3)
            db = bench(lambda: jax.block_until_ready(f(*dev_args)))
            marks = [f"{name}.{who}.{i}" for i in range(5)]
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as p:
                for m in marks:
                    with torch.profiler.record_function(m):
                        jax.block_until_ready(f(*dev_args))
            path = os.path.join(trace_dir, f"trace_{name}_{who}.json")
            p.export_chrome_trace(path)
            rows = _gpu_timeline(path, marks)

            def med(k):
                vals = [r[k] for r in rows if k in r]
                return f"{statistics.median(vals):.0f}" if vals else "-"
            out.append(f"| {name} | {who} | {statistics.median(walls):.3f} | {db:.3f} | "
                       f"{med('host_us')} | {med('first_gpu_us')} | {med('gpu_span_us')} | "
                       f"{med('busy_us')} | {med('max_gap_us')} | {med('after_last_us')} |")
            print(out[-1], flush=True)
            last = rows[-1].get("kernels", []) if rows else []
            kernel_lists.append(f"### {name}, {who}: {len(last)} GPU ops, "
                                f"{sum(d for _, d in last):.1f} us\n\n```\n" + "\n".join(
                                    f"{d:8.1f} us  {n[:110]}" for n, d in last) + "\n```\n")
        del xc, hc
        torch.cuda.empty_cache()
    out.append("\n## GPU ops of the last profiled call (CUPTI durations)\n")
    out += kernel_lists


INT8 = """HloModule int8
ENTRY %e (a: s8[8192,8192], b: s8[8192,8192]) -> s32[8192,8192] {
  %a = s8[8192,8192]{1,0} parameter(0)
  %b = s8[8192,8192]{LAYOUT} parameter(1)
  ROOT %d = s32[8192,8192]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}"""


def int8_configs(out: list[str]) -> None:
    import torch
    import hlo
    from codegen.triton import compile_fusion
    from runtime.cuda.thunks import one_instruction_fusion
    n = 8192
    a = torch.randint(-128, 128, (n, n), dtype=torch.int8, device="cuda")
    b_rows = torch.randint(-128, 128, (n, n), dtype=torch.int8, device="cuda")
    b_cols = b_rows.t().contiguous().t()         # same values, K-major memory
    c = torch.empty((n, n), dtype=torch.int32, device="cuda")
    want = None
    out.append("## int8 GEMM 8192^3: Triton template configs (TOPS)\n")
    out.append("| rhs layout | BLOCK_M | BLOCK_N | BLOCK_K | warps | stages | ms | TOPS | exact |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for layout, b in (("{1,0} N-major", b_rows), ("{0,1} K-major", b_cols)):
        m = hlo.parse_hlo(INT8.replace("LAYOUT", layout.split()[0][1:-1]))
        dot = m.entry.root
        k = compile_fusion(one_instruction_fusion(dot), target="h200")
        for cfg in k.plan.candidates or [k.config]:
            try:
                k.launch([c], [a, b], config=cfg)
                torch.cuda.synchronize()
                if want is None:
                    want = torch._int_mm(a, b_rows.contiguous()) if hasattr(torch, "_int_mm") \
                        else c.clone()
                exact = bool(torch.equal(c, want))
                ms = bench(lambda: k.launch([c], [a, b], config=cfg), rep=100)
                tops = 2 * n ** 3 / (ms * 1e-3) / 1e12
                out.append(f"| {layout} | {cfg['BLOCK_M']} | {cfg['BLOCK_N']} | {cfg['BLOCK_K']} | "
                           f"{cfg['num_warps']} | {cfg['num_stages']} | {ms:.3f} | {tops:.0f} | "
                           f"{exact} |")
            except Exception as e:  # noqa: BLE001  (a config that does not fit: say so)
                out.append(f"| {layout} | {cfg} | failed: {type(e).__name__}: "
                           f"{str(e).splitlines()[0][:100]} |")
            print(out[-1], flush=True)
    # cuBLAS's int8 GEMM wants B K-major ("TN"): torch._int_mm on the column-major view.
    for label, b in (("row-major b", b_rows), ("K-major b (b.t() contiguous)", b_cols)):
        try:
            torch._int_mm(a, b, out=c)
            torch.cuda.synchronize()
            exact = bool(torch.equal(c, want)) if want is not None else "?"
            ms = bench(lambda: torch._int_mm(a, b, out=c), rep=100)
            out.append(f"| torch._int_mm, {label} | | | | | | {ms:.3f} | "
                       f"{2 * n ** 3 / (ms * 1e-3) / 1e12:.0f} | {exact} |")
        except Exception as e:  # noqa: BLE001
            out.append(f"| torch._int_mm, {label} | failed: {type(e).__name__}: "
                       f"{str(e).splitlines()[0][:100]} |")
        print(out[-1], flush=True)


TRANSPOSES = (("s8", (8192, 8192)), ("f32", (8192, 4096)), ("bf16", (16, 1024, 1024)))


def transposes(out: list[str]) -> None:
    """Layout-changing copies (the minor dim moves): the Triton transpose template's
    configs against torch's strided copy_, in GB/s (bytes read + written)."""
    import torch
    import hlo
    from codegen.triton import compile_fusion
    from runtime.cuda.arena import torch_dtype
    from runtime.cuda.thunks import one_instruction_fusion
    out.append("## layout-changing copies (GB/s, read + written)\n")
    out.append("| copy | config | ms | GB/s | exact |")
    out.append("|---|---|---|---|---|")
    for dt, dims in TRANSPOSES:
        rank = len(dims)
        src_layout = ",".join(str(d) for d in reversed(range(rank)))
        dst_order = [rank - 2, rank - 1] + list(reversed(range(rank - 2)))
        shape = ",".join(map(str, dims))
        m = hlo.parse_hlo(f"HloModule m\nENTRY e {{\n  p = {dt}[{shape}]{{{src_layout}}} "
                          f"parameter(0)\n  ROOT c = {dt}[{shape}]{{{','.join(map(str, dst_order))}}}"
                          " copy(p)\n}")
        k = compile_fusion(one_instruction_fusion(m.entry.root), target="h200")
        tdt = torch_dtype(m.entry.root.shape.dtype)
        x = (torch.randn(dims, device="cuda") * 50).to(tdt)
        want = x.transpose(-1, -2).contiguous().transpose(-1, -2)
        dst = torch.empty_like(want)
        nbytes = 2 * x.numel() * x.element_size()
        ms = bench(lambda: dst.copy_(x), rep=100)
        label = f"{dt}{list(dims)}"
        out.append(f"| {label} | torch copy_ | {ms:.4f} | {nbytes / ms / 1e6:.0f} | "
                   f"{bool(torch.equal(dst, want))} |")
        print(out[-1], flush=True)
        for cfg in [k.config] + [c for c in k.plan.candidates if c != k.config]:
            dst.zero_()
            k.launch([dst], [x], config=cfg)
            torch.cuda.synchronize()
            exact = bool(torch.equal(dst, want))
            ms = bench(lambda: k.launch([dst], [x], config=cfg), rep=100)
            tag = f"{cfg['BLOCK_A']}x{cfg['BLOCK_B']} w{cfg['num_warps']}"
            out.append(f"| {label} | {tag}{' (default)' if cfg == k.config else ''} | {ms:.4f} | "
                       f"{nbytes / ms / 1e6:.0f} | {exact} |")
            print(out[-1], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--parts", default="int8,host", help="comma-separated: int8, host, pool, wait, transpose, timeline")
    ap.add_argument("--programs", default="mlp_train,gelu_mlp,int8_matmul",
                    help="gpu_suite programs the timeline part profiles")
    opts = ap.parse_args()
    out: list[str] = ["# GPU probe\n"]
    chosen = set(opts.parts.split(","))
    parts = (("int8", int8_configs), ("host", host_overhead), ("pool", output_release),
             ("wait", waiting), ("dlpack", dlpack_steps), ("transpose", transposes), ("timeline", lambda o: timeline(o, "/tmp", tuple(opts.programs.split(",")))))
    for key, part in [(k, p) for k, p in parts if k in chosen]:
        try:
            part(out)
        except Exception:  # noqa: BLE001
            import traceback
            out.append(f"{key} failed:\n```\n{traceback.format_exc()}\n```")
            print(out[-1], flush=True)
    with open(os.path.join(opts.out, "gpu_probe.md"), "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()

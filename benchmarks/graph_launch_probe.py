"""How a CUDA graph's launch cost and its first kernel's start grow with its node count
(lead, fourth 2026-11-26 session). mlp_train's native graph (31 nodes) starts with a
memset node and its first GEMM begins 54 µs after it even when the graph is replayed
alone; the transformer's (11 nodes) shows no such gap. Question: does cuGraphLaunch
submit kernel nodes only after processing the whole graph (so the first kernel waits
~1.3 µs per node), and would a small head graph launched first start the GPU earlier?

For N in (1, 4, 11, 31, 64) kernel nodes (tiny kernels, ~2 µs each) captured with torch,
with and without a leading memset node: host µs of ``graph.replay()`` (median), and from
CUPTI the start of the first kernel and of the memset relative to the launch's own
start event. Also a head/tail split: a 1-node graph then the N-1 graph.

    python -m benchmarks.graph_launch_probe [--out FILE]
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time


def build(n: int, memset: bool, work: int = 1 << 16):
    import torch
    x = torch.zeros(work, device="cuda")
    scratch = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    cuda = ctypes.CDLL("libcuda.so.1")
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        x.add_(1.0)     # warm the kernel before capture
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            if memset:
                # cuMemsetD8Async during capture becomes a memset node
                rc = cuda.cuMemsetD8Async(ctypes.c_uint64(scratch.data_ptr()), ctypes.c_ubyte(0),
                                          ctypes.c_size_t(scratch.numel()),
                                          ctypes.c_void_p(s.cuda_stream))
                assert rc == 0, rc
            for _ in range(n):
                x.mul_(1.0001)
    return g, (x, scratch)


def host_us(g, reps: int = 200) -> float:
    import torch
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        g.replay()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(times)


def first_kernel_us(graphs, steps: int = 20) -> dict:
    """CUPTI: for each launch (graphs run back to back after a sync), the first record's
    start to the first *kernel*'s start, and the last kernel's end to the first start."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            torch.cuda.synchronize()
            for g in graphs:
                g.replay()
            torch.cuda.synchronize()
            time.sleep(0.0005)
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    ev.sort(key=lambda e: e.time_range.start)
    calls, cur, end = [], [], None
    for e in ev:
        if end is not None and e.time_range.start - end > 200:
            calls.append(cur)
            cur = []
        cur.append(e)
        end = max(end or 0, e.time_range.end)
    if cur:
        calls.append(cur)
    first_k, span, memset_gap = [], [], []
    for c in calls[2:]:
        t0 = c[0].time_range.start
        ks = [e for e in c if "emset" not in e.name]
        ms = [e for e in c if "emset" in e.name]
        if ks:
            first_k.append(ks[0].time_range.start - t0)
            span.append(max(e.time_range.end for e in c) - t0)
        if ms and ks:
            memset_gap.append(ks[0].time_range.start - ms[0].time_range.end)
    med = lambda v: statistics.median(v) if v else float("nan")  # noqa: E731
    return {"first_kernel_us": med(first_k), "span_us": med(span), "memset_to_kernel_us": med(memset_gap)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    opts = ap.parse_args()
    import torch
    torch.cuda.init()
    lines = ["| nodes | memset first | host µs per replay | first kernel after first record (µs) | "
             "memset end to first kernel (µs) | span (µs) |", "|---|---|---|---|---|---|"]
    for n in (1, 4, 11, 31, 64):
        for memset in (False, True):
            g, keep = build(n, memset)
            for _ in range(5):
                g.replay()
            h = host_us(g)
            f = first_kernel_us([g])
            lines.append(f"| {n} | {memset} | {h:.1f} | {f['first_kernel_us']:.1f} | "
                         f"{f['memset_to_kernel_us']:.1f} | {f['span_us']:.1f} |")
            print(lines[-1], flush=True)
            del g, keep
    # wall of one launch from the host clock to the GPU done, one graph vs head + tail
    lines += ["", "| nodes | one graph: wall µs (launch to sync) | head 1 + tail: wall µs |", "|---|---|---|"]
    for n in (11, 31, 64):
        g, k1 = build(n, True)
        h, k2 = build(1, True)
        t, k3 = build(n - 1, False)
        for gg in (g, h, t):
            gg.replay()
        torch.cuda.synchronize()

        def wall(fn, reps=200):
            v = []
            for _ in range(reps):
                torch.cuda.synchronize()
                t0 = time.perf_counter_ns()
                fn()
                torch.cuda.synchronize()
                v.append((time.perf_counter_ns() - t0) / 1e3)
            return statistics.median(v)
        a = wall(g.replay)
        b = wall(lambda: (h.replay(), t.replay()))
        lines.append(f"| {n} | {a:.1f} | {b:.1f} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    if opts.out:
        with open(opts.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()

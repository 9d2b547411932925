"""Where a call's wall time goes (issue 12): host steps and device work of one call, in one
clock, for hlotk's native path and for jax.jit, same process.

    PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu python3 -m benchmarks.call_timeline
        [--only attn_fwd,adam_step,giou,softmax,matmul] [--reps 40] [--rounds 3]
        [--out benchmarks/call_timeline.md] [--profile] [--variant LABEL:ENV=VALUE]

Each rep starts as ``gpu_suite.wall_ms`` does (L2 flushed, GPU idle), then: t0, the call,
t1 (the call returned), the wait, t2 (result ready). For hlotk the FFI handler also records
(trace mode, ``NativeGraph.trace``) its entry, patch and launch times in the same clock
(CLOCK_MONOTONIC: ``time.perf_counter_ns``) and CUDA events around its launch, read against
a base event recorded on torch's idle stream just before t0. So a call splits into:

- ``pre``: t0 to the handler's entry (runtime.jit's wrapper, JAX's C++ dispatch: argument
  checks, result allocation, XLA's thunk setup);
- ``handler``: the handler (gather + patch + launch);
- ``post``: the handler's exit to the call's return (JAX creating the result arrays);
- ``gpu start``/``gpu end``: the launch's start and end on the device, µs after t0 (the base
  event fires when recorded: the GPU is idle), ``gpu``: the launch's own device time;
- ``ready lag``: t2 minus ``gpu end``: from the device finishing to the caller seeing it.

Three ways to wait, each its own reps: ``block_until_ready`` (what gpu_suite times),
``is_ready`` polled in a loop, and ``torch.cuda.synchronize()`` (the CUDA driver's own wait
for the whole device). jax.jit gets the same t0/t1/t2 (no handler); with ``--profile``
a CUPTI trace (torch.profiler) of a few calls of each gives jax.jit's kernel times too.
Also ``do_bench`` and ``wall_ms`` (as gpu_suite), back-to-back dispatch µs (results dropped:
two address sets alternate) and ``rotating`` (the last 4 results held: five sets), with the
handler's µs and nodes patched per call; hlotk runs twice, with the default slots
(instantiations kept per address set, ``HLOTK_NATIVE_SLOTS``) and with one slot.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")

import numpy as np  # noqa: E402


def programs(only: set) -> list:
    import jax.numpy as jnp
    import ml_dtypes
    from benchmarks.attention import causal_attention
    from benchmarks.gpu_suite import programs as suite
    r = np.random.default_rng(0)
    out = []
    if "attn_fwd" in only:
        qkv = tuple(r.standard_normal((2, 4096, 16, 128)).astype(ml_dtypes.bfloat16)
                    for _ in range(3))
        out.append(("attn_fwd", causal_attention, qkv))
    for p in suite():
        if p[0] in only:
            out.append((p[0], p[2], p[3]))
    if "matmul" in only:       # an XLA-only reference of similar device time (~0.4 ms)
        ab = (r.standard_normal((4096, 8192)).astype(ml_dtypes.bfloat16),
              r.standard_normal((8192, 4096)).astype(ml_dtypes.bfloat16))
        out.append(("matmul", lambda a, b: jnp.dot(a, b), ab))
    return out


def leaves_of(out) -> list:
    import jax
    return jax.tree_util.tree_leaves(out)


def timeline(call, graph, reps: int, wait: str, flush) -> dict:
    """Medians over ``reps`` cold calls (see the module docstring), µs."""
    import jax
    import torch
    from runtime.cuda.errors import NativeLauncherError
    stream = torch.cuda.current_stream().cuda_stream
    clock = time.perf_counter_ns
    rows: dict = {k: [] for k in ("call", "wait", "wall", "pre", "handler", "post",
                                  "gpu start", "gpu", "gpu end", "ready lag")}
    for _ in range(reps):
        flush.zero_()
        torch.cuda.synchronize()
        if graph is not None:
            graph.trace_base(stream)
        t0 = clock()
        out = call()
        t1 = clock()
        if wait == "block_until_ready":
            jax.block_until_ready(out)
        elif wait == "is_ready":
            for x in leaves_of(out):
                while not x.is_ready():
                    pass
        else:
            torch.cuda.synchronize()
        t2 = clock()
        rows["call"].append((t1 - t0) / 1e3)
        rows["wait"].append((t2 - t1) / 1e3)
        rows["wall"].append((t2 - t0) / 1e3)
        tr = None
        if graph is not None:
            try:
                tr = graph.trace_read()
            except NativeLauncherError:      # this call launched nothing traced: no split
                rows.setdefault("untraced calls", []).append(1)
        if tr is not None:
            rows["pre"].append((tr["entry_ns"] - t0) / 1e3)
            rows["handler"].append((tr["launched_ns"] - tr["entry_ns"]) / 1e3)
            rows["post"].append((t1 - tr["launched_ns"]) / 1e3)
            rows["gpu start"].append(tr["start_ms"] * 1e3)
            rows["gpu"].append(tr["device_ms"] * 1e3)
            rows["gpu end"].append(tr["end_ms"] * 1e3)
            rows["ready lag"].append((t2 - t0) / 1e3 - tr["end_ms"] * 1e3)
        del out
    out = {k: statistics.median(v) for k, v in rows.items() if v and k != "untraced calls"}
    if rows.get("untraced calls"):
        out["untraced calls"] = float(len(rows["untraced calls"]))
    return out


def cupti(calls: dict, n: int = 8) -> dict:
    """jax.jit's and hlotk's kernels under torch.profiler (CUPTI): per call, µs from the
    call's start to its first kernel's start, the kernels' span, and from the last kernel's
    end to the result being ready (block_until_ready). Medians over ``n`` cold calls."""
    import jax
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    out: dict = {}
    for who, call in calls.items():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(n):
                flush.zero_()
                torch.cuda.synchronize()
                with record_function(f"hk_call_{i}"):
                    jax.block_until_ready(call())
        path = os.path.join(os.environ.get("OUT", "/tmp"), f"trace_{who.replace(' ', '_')}.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            ev = json.load(f)["traceEvents"]
        calls_ev = sorted((e for e in ev if e.get("name", "").startswith("hk_call_")
                           and e.get("ph") == "X" and e.get("cat") == "user_annotation"),
                          key=lambda e: e["ts"])
        kernels = sorted((e for e in ev if e.get("cat") == "kernel" and e.get("ph") == "X"),
                         key=lambda e: e["ts"])
        rows: dict = {"to first kernel": [], "kernel span": [], "kernel sum": [],
                      "last kernel to ready": [], "wall": [], "kernels": []}
        for c in calls_ev:
            lo, hi = c["ts"], c["ts"] + c["dur"]
            ks = [k for k in kernels if lo <= k["ts"] <= hi and "zero" not in k["name"]
                  and "fill" not in k["name"].lower()]
            if not ks:
                continue
            end = max(k["ts"] + k["dur"] for k in ks)
            rows["to first kernel"].append(ks[0]["ts"] - lo)
            rows["kernel span"].append(end - ks[0]["ts"])
            rows["kernel sum"].append(sum(k["dur"] for k in ks))
            rows["last kernel to ready"].append(hi - end)
            rows["wall"].append(c["dur"])
            rows["kernels"].append(len(ks))
        out[who] = {k: statistics.median(v) for k, v in rows.items() if v}
        if os.path.getsize(path) > 12 << 20:
            os.unlink(path)
    return out


SLOTS_VARIANT = [("hlotk 1 slot", {"HLOTK_NATIVE_SLOTS": "1"})]


def wrapper_text(name: str, compiled, dev) -> None:
    """XLA's compiled HLO of the jax.jit wrapper around the native call, and its memory
    analysis, to $OUT/wrapper_<name>.txt: what XLA runs per call besides the FFI call."""
    fast = getattr(compiled, "_native_jit", None)
    if fast is None:
        return
    xc = fast.lower(*dev).compile()
    path = os.path.join(os.environ.get("OUT", "/tmp"), f"wrapper_{name}.txt")
    with open(path, "w") as f:
        f.write(f"{xc.memory_analysis()}\n\n{xc.as_text()}")
    print(f"{name}: XLA's wrapper HLO in {path}", flush=True)


def measure(name: str, fn, args, reps: int, rounds: int, profile_on: bool,
            variants: list = SLOTS_VARIANT) -> tuple[str, dict]:
    import jax
    import torch
    import runtime
    from benchmarks.gpu_suite import bench, rel_err, wall_ms
    from benchmarks.host_overhead import dispatch_us
    from runtime.cuda import executable_of
    dev = jax.device_put(args)
    jax.block_until_ready(dev)
    xc = jax.jit(fn).lower(*dev).compile()
    want = jax.block_until_ready(xc(*dev))
    who: dict = {"jax.jit": lambda: xc(*dev)}
    graphs: dict = {}
    if name != "matmul":
        # hlotk twice: the default slots (instantiations kept per address set) and one slot
        # (every moved address re-patched), each its own executable and native graph.
        # (or ``--variant`` sides: environment settings held while each is compiled and
        # first called, e.g. a code generator switch)
        from benchmarks.suite_rounds import _Env
        for label, env in [("hlotk", {})] + list(variants):
            with _Env(env):
                hc = runtime.jit(fn, backend="cuda").lower(*dev).compile()
                got = jax.block_until_ready(hc(*dev))     # builds the native graph
            err = max(rel_err(g, w) for g, w in zip(leaves_of(got), leaves_of(want)))
            exe = executable_of(hc)
            print(f"{name} ({label}): err {err:.1e}; {exe.report()}", flush=True)
            who[label] = lambda hc=hc: hc(*dev)
            graphs[label] = exe.native
            if label == "hlotk":
                wrapper_text(name, hc, dev)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    res: dict = {}
    waits = ("block_until_ready", "is_ready", "torch.cuda.synchronize")
    for _ in range(rounds):
        for w, call in who.items():
            graph = graphs.get(w)
            d = res.setdefault(w, {})
            d.setdefault("do_bench", []).append(bench(lambda: jax.block_until_ready(call())) * 1e3)
            d.setdefault("wall_ms", []).append(wall_ms(lambda: jax.block_until_ready(call())) * 1e3)
            if graph is not None:
                graph.reset_stats()
            d.setdefault("dispatch", []).append(dispatch_us(call, budget_s=0.1, max_calls=400))
            if graph is not None:   # handler µs and nodes patched per call, back-to-back
                s = graph.stats()
                d.setdefault("handler (dispatch)", []).append(
                    s["gather_us"] + s["patch_us"] + s["launch_us"])
                d.setdefault("nodes patched (dispatch)", []).append(
                    s["nodes_patched"] / max(s["calls"], 1))
                graph.reset_stats()
            d.setdefault("rotating", []).append(
                dispatch_us(call, keep=4, budget_s=0.05, max_calls=200))
            if graph is not None:
                s = graph.stats()
                d.setdefault("handler (rotating)", []).append(
                    s["gather_us"] + s["patch_us"] + s["launch_us"])
                graph.trace(True)
            for wt in waits:
                t = timeline(call, graph, reps, wt, flush)
                for k, v in t.items():
                    d.setdefault(f"{wt}: {k}", []).append(v)
            if graph is not None:
                graph.trace(False)
    med = {w: {k: statistics.median(v) for k, v in d.items()} for w, d in res.items()}
    if profile_on:
        try:
            prof = cupti(who)
            for w, d in prof.items():
                med[w].update({f"cupti: {k}": v for k, v in d.items()})
        except Exception as e:  # noqa: BLE001  (the trace is extra; the timings stand)
            print(f"{name}: CUPTI trace failed: {type(e).__name__}: {e}", flush=True)
    lines = [f"### {name}", "", "| µs | " + " | ".join(med) + " |",
             "|---|" + "---|" * len(med)]
    keys: list = []
    for d in med.values():
        keys += [k for k in d if k not in keys]
    for k in keys:
        lines.append(f"| {k} | " + " | ".join(f"{d[k]:.1f}" if k in d else "-"
                                               for d in med.values()) + " |")
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    return text, med


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="attn_fwd,adam_step,giou,softmax,matmul")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default="benchmarks/call_timeline.md")
    ap.add_argument("--variant", action="append", default=[],
                    help="LABEL:ENV=VALUE[,...]: hlotk sides instead of the 1-slot one")
    opts = ap.parse_args()
    from benchmarks.suite_rounds import parse_variant
    variants = [parse_variant(v) for v in opts.variant] or SLOTS_VARIANT
    import jax
    import torch
    from benchmarks.host_overhead import write_report
    only = set(opts.only.split(","))
    head = (f"# Call timeline (issue 12)\n\nDevice: {torch.cuda.get_device_name()}; jax "
            f"{jax.__version__}, torch {torch.__version__}. Medians of {opts.rounds} rounds x "
            f"{opts.reps} cold calls, µs (benchmarks/call_timeline.py says what each row is).\n")
    parts, data = [head], {}
    for name, fn, args in programs(only):
        t0 = time.time()
        try:
            text, med = measure(name, fn, args, opts.reps, opts.rounds, opts.profile, variants)
            parts.append(text)
            data[name] = med
        except Exception as e:  # noqa: BLE001  (one program failing must not hide the rest)
            import traceback
            traceback.print_exc()
            parts.append(f"### {name}\n\nFAILED: {type(e).__name__}: {e}\n")
        print(f"[{time.time() - t0:.0f}s] {name}", flush=True)
        write_report("\n".join(parts), opts.out)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "call_timeline.json"), "w") as f:
        json.dump(data, f, indent=1)


if __name__ == "__main__":
    main()

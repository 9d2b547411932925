"""Per-kernel device time of one program, hlotk and XLA side by side, from CUPTI.

``kernel_table(fn, args)`` runs the program through ``runtime.jit(backend="cuda")`` (its
kernels replayed inside the CUDA graph, as a real call runs them) and through ``jax.jit``,
each under ``torch.profiler`` (CUPTI activity records: every kernel the process launches,
JAX's own included, graph nodes included), and returns what each kernel costs per call:

- per kernel name: calls per step, device µs per step (sum of its durations / steps);
- per category (cuBLAS GEMM, attention, GEMM prologue/epilogue, reduction, elementwise ...);
- the step's kernel sum and its device span (first kernel start to last kernel end of one
  call: the sum plus the gaps between kernels).

hlotk's Triton kernel names are mapped back to the thunks that launch them (a split GEMM
fusion's ``%fusion.14.prologue1``), so a row says which fusion it is. Run on the GPU:

    python -m benchmarks.attention --only suite --kernels     # the training step
"""
from __future__ import annotations

import gzip
import json
import os
import statistics
import tempfile
from collections import defaultdict
from typing import Any, Callable, Optional

# Kernel names of library GEMMs (cuBLAS/cuBLASLt: nvjet on Hopper, xmma/cutlass otherwise).
_GEMM_MARKERS = ("nvjet", "gemm", "xmma", "cutlass", "cublas", "sm90_", "sm80_")
_ATTN_MARKERS = ("_fwd", "_bwd_dq", "_bwd_dkdv", "flash", "attention", "fmha")
# A gap this long between two kernels separates calls (a call's own gaps are µs).
CALL_GAP_US = 100.0


def capture_graph(run: Callable[[], Any]) -> Any:
    """``run`` (launches on the current stream) captured in a torch CUDA graph, after a
    warm-up run on the capture stream: replay it to time the kernels as an executable's
    graph runs them, without Python's launch cost between them."""
    import torch
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return graph


def cuda_trace_events(run: Callable[[], Any], steps: int, sync_each: bool = True) -> list[dict]:
    """The chrome-trace events torch.profiler records (CUPTI) over ``steps`` calls of
    ``run``, each followed by a device synchronize when ``sync_each``."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
            if sync_each:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as fh:
            return json.load(fh).get("traceEvents", [])
    finally:
        os.unlink(path)


def _trace_kernels(run: Callable[[], Any], steps: int) -> list[dict]:
    """Kernel (and memcpy/memset) records of ``steps`` calls of ``run`` (each followed by a
    device synchronize), from torch.profiler's chrome trace: name, ts, dur (µs)."""
    events = cuda_trace_events(run, steps)
    return [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e.get("dur", 0.0)),
             "cat": e.get("cat", "")}
            for e in events if e.get("ph") == "X"
            and e.get("cat", "") in ("kernel", "gpu_memcpy", "gpu_memset")]


def _jax_trace_kernels(run: Callable[[], Any], steps: int) -> list[dict]:
    """The same records from jax.profiler's perfetto trace (used when CUPTI through torch
    saw none of XLA's kernels): events on the GPU's stream lines."""
    import jax
    d = tempfile.mkdtemp(prefix="hlotk_jaxprof_")
    with jax.profiler.trace(d, create_perfetto_trace=True):
        for _ in range(steps):
            jax.block_until_ready(run())
    path = None
    for root, _, files in os.walk(d):
        for f in files:
            if f.endswith("perfetto_trace.json.gz"):
                path = os.path.join(root, f)
    if path is None:
        return []
    with gzip.open(path) as fh:
        data = json.load(fh)
    events = data.get("traceEvents", data if isinstance(data, list) else [])
    gpu_pids = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
                and "/device:GPU" in str(e.get("args", {}).get("name", ""))}
    return [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e.get("dur", 0.0)),
             "cat": "kernel"}
            for e in events if e.get("ph") == "X" and e.get("pid") in gpu_pids
            and "Stream" not in str(e.get("name", ""))]


def _spans(records: list[dict]) -> list[float]:
    """Device span (µs) of each call: records split where the GPU idled > CALL_GAP_US."""
    recs = sorted(records, key=lambda r: r["ts"])
    spans: list[float] = []
    start = end = None
    for r in recs:
        if start is None or r["ts"] - end > CALL_GAP_US:
            if start is not None:
                spans.append(end - start)
            start, end = r["ts"], r["ts"] + r["dur"]
        else:
            end = max(end, r["ts"] + r["dur"])
    if start is not None:
        spans.append(end - start)
    return spans


def call_sequence(records: list[dict]) -> list[dict]:
    """The kernels of the last complete call (split as ``_spans`` splits), in start order,
    each with its start offset, duration and the idle gap before it (µs): where a call's
    span exceeds its kernel sum."""
    recs = sorted(records, key=lambda r: r["ts"])
    calls: list[list[dict]] = []
    end = None
    for r in recs:
        if end is None or r["ts"] - end > CALL_GAP_US:
            calls.append([])
            end = r["ts"] + r["dur"]
        calls[-1].append(r)
        end = max(end, r["ts"] + r["dur"])
    if not calls:
        return []
    call = calls[-2] if len(calls) > 1 else calls[-1]      # the last may be cut short
    t0 = call[0]["ts"]
    out, busy_until = [], t0
    for r in call:
        out.append({"name": r["name"], "start": r["ts"] - t0, "dur": r["dur"],
                    "gap": max(0.0, r["ts"] - busy_until), "cat": r.get("cat", "")})
        busy_until = max(busy_until, r["ts"] + r["dur"])
    return out


def format_sequence(seq: list[dict], names: Optional[dict[str, list[str]]] = None) -> str:
    """One line per kernel of ``call_sequence``: gap before, start, duration, name."""
    lines = [f"{'gap':>7} {'start':>8} {'dur':>8}  kernel"]
    for r in seq:
        label = r["name"][:90]
        if names and r["name"] in names:
            label += "  " + ",".join(names[r["name"]])[:80]
        lines.append(f"{r['gap']:7.2f} {r['start']:8.2f} {r['dur']:8.2f}  {label}")
    lines.append(f"gaps {sum(r['gap'] for r in seq):.1f} us over {len(seq)} records; "
                 f"kernels {sum(r['dur'] for r in seq):.1f} us")
    return "\n".join(lines)


def hlotk_kernel_names(exe: Any) -> dict[str, list[str]]:
    """Triton kernel function name -> the thunks (instruction names) that launch it."""
    out: dict[str, list[str]] = defaultdict(list)
    for t in exe.thunks():
        k = getattr(t, "kernel", None)
        name = getattr(k, "name", None)
        if name:
            out[name].append(f"{t.inst.name}[{getattr(k, 'template', '?')}]")
    return dict(out)


_REDUCTION_TEMPLATES = ("[looped_rows]", "[normalization]", "[column_reduction]")


def category(name: str, thunks: Optional[list[str]] = None) -> str:
    """What a kernel is, from its name (and for hlotk the thunks launching it)."""
    low = name.lower()
    if thunks:
        if all(".prologue" in t for t in thunks):
            return "gemm prologue"
        if all(".epilogue" in t for t in thunks):
            return "gemm epilogue"
        if all(t.endswith(_REDUCTION_TEMPLATES) for t in thunks):
            return "reduction"
        if all(t.endswith("[transpose]") for t in thunks):
            return "copy/transpose"
    if any(m in low for m in _ATTN_MARKERS) and "fusion" not in low:
        return "attention"
    if any(m in low for m in _GEMM_MARKERS) and "fused_" not in low and "triton" not in low:
        return "library gemm"
    if "triton_gemm" in low or "__triton" in low:
        return "triton gemm"
    if "reduce" in low or "reduction" in low:
        return "reduction"
    if "memcpy" in low or "memset" in low or "copy" in low or "transpose" in low:
        return "copy/transpose"
    return "elementwise/other"


def summarize(records: list[dict], steps: int,
              names: Optional[dict[str, list[str]]] = None) -> dict:
    """Per kernel name and per category: calls and µs per step; kernel sum; span."""
    per: dict[str, list[float]] = defaultdict(list)
    for r in records:
        per[r["name"]].append(r["dur"])
    kernels = []
    for name, durs in per.items():
        thunks = (names or {}).get(name)
        kernels.append({"name": name, "calls": len(durs) / steps, "us": sum(durs) / steps,
                        "mean_us": sum(durs) / len(durs), "category": category(name, thunks),
                        "thunks": thunks or []})
    kernels.sort(key=lambda k: -k["us"])
    cats: dict[str, dict] = {}
    for k in kernels:
        c = cats.setdefault(k["category"], {"calls": 0.0, "us": 0.0})
        c["calls"] += k["calls"]
        c["us"] += k["us"]
    spans = _spans(records)
    return {"kernels": kernels, "categories": cats,
            "sum_us": sum(k["us"] for k in kernels),
            "launches": sum(k["calls"] for k in kernels),
            "span_us": statistics.median(spans) if spans else float("nan"),
            "sequence": call_sequence(records),
            "calls_seen": len(spans), "steps": steps}


def kernel_table(fn: Callable, args: tuple, *, pipeline: Optional[str] = None,
                 steps: int = 5, hlotk: bool = True, xla: bool = True,
                 dump_dir: str = "", tag: str = "hlotk") -> dict:
    """{tag: summary, "xla": summary} for ``fn(*args)`` (see ``summarize``); with
    ``dump_dir``, hlotk's fused module, its thunks and XLA's optimized HLO are written there."""
    import jax
    import runtime
    from runtime.cuda import executable_of
    dev_args = jax.device_put(args)
    jax.block_until_ready(dev_args)
    out: dict[str, Any] = {}
    if hlotk:
        kw = {"pipeline": pipeline} if pipeline else {}
        hc = runtime.jit(fn, backend="cuda", **kw).lower(*dev_args).compile()
        exe = executable_of(hc)
        for _ in range(4):           # compile, autotune, capture the graph, replay
            jax.block_until_ready(hc(*dev_args))
        recs = _trace_kernels(lambda: jax.block_until_ready(hc(*dev_args)), steps)
        out[tag] = summarize(recs, steps, hlotk_kernel_names(exe))
        out[tag]["thunks"] = len(exe.thunks())
        if dump_dir:
            with open(os.path.join(dump_dir, f"{tag}.hlo"), "w") as fh:
                fh.write(hc.as_text())
            with open(os.path.join(dump_dir, f"{tag}.thunks"), "w") as fh:
                fh.write(exe.describe())
        del hc, exe
    if xla:
        xc = jax.jit(fn).lower(*dev_args).compile()
        for _ in range(3):
            jax.block_until_ready(xc(*dev_args))
        recs = _trace_kernels(lambda: jax.block_until_ready(xc(*dev_args)), steps)
        if not recs:
            recs = _jax_trace_kernels(lambda: xc(*dev_args), steps)
            out["xla_source"] = "jax.profiler"
        out["xla"] = summarize(recs, steps)
        if dump_dir:
            with open(os.path.join(dump_dir, "xla.hlo"), "w") as fh:
                fh.write(xc.as_text())
    return out


def format_table(res: dict, top: int = 40) -> str:
    """Categories side by side, then each side's top kernels."""
    lines = []
    sides = [s for s in res if isinstance(res[s], dict) and "kernels" in res[s]]
    for s in sides:
        r = res[s]
        lines.append(f"{s}: kernel sum {r['sum_us']:.1f} us/step over {r['launches']:.0f} "
                     f"launches; device span {r['span_us']:.1f} us (median of {r['calls_seen']} "
                     f"calls seen, {r['steps']} run)")
    cats = sorted({c for s in sides for c in res[s]["categories"]},
                  key=lambda c: -max(res[s]["categories"].get(c, {"us": 0})["us"] for s in sides))
    lines.append(f"{'category':20s} " + " ".join(f"{s + ' us':>10s} {s + ' n':>8s}" for s in sides))
    for c in cats:
        cells = []
        for s in sides:
            v = res[s]["categories"].get(c, {"us": 0.0, "calls": 0.0})
            cells.append(f"{v['us']:10.1f} {v['calls']:8.1f}")
        lines.append(f"{c:20s} " + " ".join(cells))
    for s in sides:
        lines.append(f"--- {s}: top kernels (us/step, launches/step, category, thunks)")
        for k in res[s]["kernels"][:top]:
            th = ",".join(k["thunks"][:4]) + (" ..." if len(k["thunks"]) > 4 else "")
            lines.append(f"{k['us']:9.1f} {k['calls']:5.1f}  {k['category']:16s} "
                         f"{k['name'][:70]}  {th}")
    return "\n".join(lines)

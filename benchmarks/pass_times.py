"""Per-pass milliseconds of one program's CUDA-pipeline compile, repeated in one process.

    python -m benchmarks.pass_times adam_step --repeat 5 [--client]

Each repeat runs the default CUDA pipeline (target h200) on a fresh copy of the lowered
module, so the first repeat shows first-use costs and the median the steady state.
``--client``: the CUDA client is made first (on a GPU: its background threads, the NVRTC
warm-up and the early compile workers, start as in a first call), then the repeats run at
once: whether those threads slow the passes down (issue 13: the passes of adam_step took
0.22-0.25 s in the GPU benchmark's child and 0.13 s deviceless).

The passes run under the cyclic collector's settings of a real compile: the process's
objects frozen once (``prewarm.freeze_gc``, as the CUDA client does) and the compile's
thresholds (``client.fewer_collections``). Without them a full collection of everything
the earlier repeats left (~0.4 s on AdamW over 200 arrays) lands in whichever pass is
running, and was read as that pass's cost (issue 13: "schedule 473 ms" was one such
collection inside ``list_schedule``). ``--plain-gc``: Python's defaults, as before.
Even so a full collection lands in some pass (where depends on how much was allocated
before it): ``gc_ms`` is the collector's time per repeat, ``gc_in_pass_ms`` the median
of each pass's share and ``net_ms`` the median of each pass's time without it."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("program")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--client", action="store_true")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--plain-gc", action="store_true")
    a = ap.parse_args(argv)
    import contextlib
    import gc
    from benchmarks.compile_time import _program
    import runtime
    from passes.fusion.pass_ import with_target
    from passes.pipelines import pipeline_spec
    from passes.base import pass_name
    from passes.pipeline import run_pipeline
    fn, args = _program(a.program)[2:4]
    t0 = time.perf_counter()
    if a.client:
        from runtime.jit import default_client
        default_client("cuda")
    client_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    lowered = runtime.jit(fn, pipeline="none").lower(*args)
    lower_s = time.perf_counter() - t0
    spec = with_target(pipeline_spec("default", "cuda"), "h200")
    collecting = contextlib.nullcontext
    if not a.plain_gc:
        from runtime.client import fewer_collections
        from runtime.cuda import prewarm
        prewarm.freeze_gc()
        collecting = fewer_collections
    gc_s = [0.0, 0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_s[1] = time.perf_counter()
        else:
            gc_s[0] += time.perf_counter() - gc_s[1]
    gc.callbacks.append(on_gc)
    gc_ms: list[float] = []
    totals: list[float] = []
    per_pass: dict[str, list[float]] = {}
    gc_pass: dict[str, list[float]] = {}
    mark = [0.0]

    def hook(event: str, p: object, module: object, record: object) -> None:
        # the collector's seconds between a pass's hooks: those inside its timed run
        if event == "before":
            mark[0] = gc_s[0]
        else:
            gc_in[pass_name(p).split("{")[0]] = gc_in.get(pass_name(p).split("{")[0], 0.0) \
                + gc_s[0] - mark[0]
    for _ in range(a.repeat):
        module = lowered.module.clone()
        g0 = gc_s[0]
        gc_in: dict[str, float] = {}
        t0 = time.perf_counter()
        with collecting():
            records = run_pipeline(module, spec, hooks=[hook])
        totals.append(time.perf_counter() - t0)
        gc_ms.append(round((gc_s[0] - g0) * 1e3, 1))
        seen: dict[str, float] = {}
        for r in records:
            seen[r.name.split("{")[0]] = seen.get(r.name.split("{")[0], 0.0) + r.seconds
        for k, v in seen.items():
            per_pass.setdefault(k, []).append(v)
            gc_pass.setdefault(k, []).append(gc_in.get(k, 0.0))
    top = sorted(per_pass.items(), key=lambda kv: -statistics.median(kv[1]))[:a.top]
    row = {"program": a.program, "python": sys.version.split()[0], "client_s": round(client_s, 4),
           "lower_s": round(lower_s, 4), "passes_s": [round(t, 4) for t in totals],
           "gc_ms": gc_ms, "gc": "plain" if a.plain_gc else "frozen+compile thresholds",
           "median_ms": {k: round(statistics.median(v) * 1e3, 2) for k, v in top},
           "first_ms": {k: round(v[0] * 1e3, 2) for k, v in top},
           "gc_in_pass_ms": {k: round(statistics.median(gc_pass[k]) * 1e3, 2) for k, _ in top},
           "net_ms": {k: round(statistics.median(t - g for t, g in zip(v, gc_pass[k])) * 1e3, 2)
                      for k, v in top}}
    print(json.dumps(row))


if __name__ == "__main__":
    main()

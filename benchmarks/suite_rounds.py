"""gpu_suite programs timed in rounds, in one process, with variants interleaved (issue 12).

    PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu python3 -m benchmarks.suite_rounds \
        [--only giou,softmax,adam_step,s8_gemm] [--rounds 5] \
        [--variant "no tiles:HLOTK_MINOR_TILES=0" ...] [--kernels giou] [--out FILE]

Host-bound timings move by ±30% between processes (benchmarks/NOTES.md, issue 12), so a
before/after comparison taken in two processes decides nothing. Here every program is compiled
once per side (jax.jit, hlotk, and each ``--variant``: a label and environment settings that
hold while that executable is compiled and first called), then each round times every side of
every program, the sides in a rotated order, with gpu_suite's two clocks (``do_bench``: median
wall per call with an L2 flush between calls; ``wall_ms``: one cold call from an idle GPU).
The table gives medians over rounds and each round's ratio range. ``--kernels`` adds each
side's device time per kernel from CUPTI (torch.profiler; calls back-to-back, inputs L2-warm,
as benchmarks/kernel_profile.py). Every hlotk side is checked against jax.jit, and each variant
against hlotk's default bit for bit.
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


def parse_variant(text: str) -> tuple[str, dict]:
    """"label:A=1,B=2" -> ("label", {"A": "1", "B": "2"})."""
    label, _, envs = text.partition(":")
    env = {}
    for kv in filter(None, envs.split(",")):
        k, _, v = kv.partition("=")
        env[k.strip()] = v.strip()
    if not label or not env:
        raise SystemExit(f"--variant {text!r}: expected LABEL:ENV=VALUE[,ENV=VALUE]")
    return label, env


class _Env:
    def __init__(self, env: dict):
        self.env, self.old = env, {}

    def __enter__(self):
        for k, v in self.env.items():
            self.old[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def build(prog, variants: list, autotune: bool) -> dict:
    """{side: (call, exe or None)} with every result checked (see the module doc)."""
    import jax
    import runtime
    from benchmarks.gpu_suite import rel_err
    from runtime.cuda import executable_of
    name, label, fn, args, nbytes, flops, fkind, tol = prog
    dev = jax.device_put(args)
    jax.block_until_ready(dev)
    xc = jax.jit(fn).lower(*dev).compile()
    want = jax.tree_util.tree_leaves(jax.block_until_ready(xc(*dev)))
    sides = {"XLA": (lambda: xc(*dev), None)}
    first = None
    for side, env in [("hlotk", {})] + variants:
        with _Env(dict(env, HLOTK_AUTOTUNE="1" if autotune else "0")):
            hc = runtime.jit(fn, backend="cuda").lower(*dev).compile()
            for _ in range(4):       # autotune, capture, replay
                got = jax.tree_util.tree_leaves(jax.block_until_ready(hc(*dev)))
        err = max(rel_err(g, w) for g, w in zip(got, want))
        same = ""
        host = [np.asarray(g) for g in got]
        if first is None:
            first = host
        else:
            same = " bitwise equal to hlotk" if all(
                a.tobytes() == b.tobytes() for a, b in zip(first, host)) else \
                " DIFFERS from hlotk"
        ok = err <= tol if tol else err == 0
        print(f"{name} [{side}]: err vs jax.jit {err:.1e} ({'ok' if ok else 'FAIL'}){same}",
              flush=True)
        exe = executable_of(hc)
        sides[side] = (lambda hc=hc: hc(*dev), exe)
        ks = exe._triton_kernels()
        if len(ks) <= 3:      # which launch config autotune (or the default) chose
            print(f"{name} [{side}]: " + "; ".join(f"{k.name} {k.config}" for k in ks),
                  flush=True)
        front = getattr(hc, "_native_jit", None)     # the jax.jit around the FFI call
        if front is not None and os.environ.get("OUT"):
            path = os.path.join(os.environ["OUT"], f"{name}_{side.replace(' ', '_')}_front.hlo")
            with open(path, "w") as f:
                f.write(front.lower(*dev).compile().as_text())
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"{name}_xla.hlo"), "w") as f:
            f.write(xc.as_text())
    return sides


def kernels(sides: dict, steps: int = 20, rotate: int = 0) -> dict:
    import jax
    from benchmarks.kernel_profile import _trace_kernels, hlotk_kernel_names, summarize
    out = {}
    order = list(sides)
    order = order[rotate % len(order):] + order[:rotate % len(order)]
    for side in order:
        call, exe = sides[side]
        recs = _trace_kernels(lambda: jax.block_until_ready(call()), steps)
        s = summarize(recs, steps, hlotk_kernel_names(exe) if exe is not None else None)
        out[side] = {"sum_us": s["sum_us"], "span_us": s["span_us"],
                     "launches": s["launches"],
                     "top": [(k["name"][:60], round(k["us"], 2), k["calls"])
                             for k in s["kernels"][:4]]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="giou,softmax,adam_step,s8_gemm")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--kernels", default="", help="programs whose kernels CUPTI times")
    ap.add_argument("--kernel-rounds", type=int, default=1,
                    help="CUPTI passes over every side of --kernels programs, the sides' "
                         "order rotated each pass (each pass's sums are reported)")
    ap.add_argument("--no-autotune", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"),
                                                  "suite_rounds.md"))
    opts = ap.parse_args()
    import jax
    import torch
    from benchmarks.gpu_suite import bench, programs, wall_ms
    variants = [parse_variant(v) for v in opts.variant]
    only = opts.only.split(",")
    progs = {p[0]: p for p in programs() if p[0] in only}
    built = {}
    for name in only:
        t0 = time.time()
        built[name] = build(progs[name], variants, not opts.no_autotune)
        print(f"[{time.time() - t0:.0f}s] built {name}", flush=True)
    res: dict = {n: {s: {"do_bench": [], "wall": []} for s in b} for n, b in built.items()}
    for r in range(opts.rounds):
        for name, sides in built.items():
            order = list(sides)
            order = order[r % len(order):] + order[:r % len(order)]
            for side in order:
                call = sides[side][0]
                res[name][side]["do_bench"].append(
                    bench(lambda: jax.block_until_ready(call())) * 1e3)
                res[name][side]["wall"].append(
                    wall_ms(lambda: jax.block_until_ready(call())) * 1e3)
        print(f"round {r + 1}/{opts.rounds} done", flush=True)
    prof: dict = {}
    for r in range(max(1, opts.kernel_rounds)):
        for name in filter(None, opts.kernels.split(",")):
            if name in built:
                prof.setdefault(name, []).append(kernels(built[name], rotate=r))
    lines = ["# gpu_suite programs in rounds (benchmarks/suite_rounds.py)", "",
             f"Device: {torch.cuda.get_device_name()}; jax {jax.__version__}, torch "
             f"{torch.__version__}. {opts.rounds} rounds, sides interleaved; µs, medians over "
             "rounds; ratio = side / XLA (median of the medians), [min-max] of the per-round "
             "ratios.", "",
             "| program | side | do_bench µs | ratio | cold wall µs | ratio |",
             "|---|---|---|---|---|---|"]
    for name, sides in res.items():
        x = sides["XLA"]
        for side, d in sides.items():
            cells = []
            for k in ("do_bench", "wall"):
                med = statistics.median(d[k])
                rs = [a / b for a, b in zip(d[k], x[k])]
                cells.append(f"{med:.1f}")
                cells.append(f"{med / statistics.median(x[k]):.2f} [{min(rs):.2f}-{max(rs):.2f}]"
                             if side != "XLA" else "")
            lines.append(f"| {name} | {side} | " + " | ".join(cells) + " |")
    for name, passes in prof.items():
        lines += ["", f"CUPTI, {name} (µs per call, back-to-back, L2-warm inputs; "
                      f"{len(passes)} pass(es), sides rotated):", ""]
        for side in passes[0]:
            sums = [p[side]["sum_us"] for p in passes]
            d = passes[-1][side]
            lines.append(f"- {side}: kernel sum {statistics.median(sums):.2f} (passes "
                         f"{', '.join(f'{x:.2f}' for x in sums)}), span {d['span_us']:.2f}, "
                         f"launches {d['launches']:.0f}; top {d['top']}")
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    with open(opts.out, "w") as f:
        f.write(text)
    with open(os.path.splitext(opts.out)[0] + ".json", "w") as f:
        json.dump({"times": res, "kernels": prof}, f, indent=1)


if __name__ == "__main__":
    main()

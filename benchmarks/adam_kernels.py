"""Adam's update kernels, ours against XLA's, one parameter shape at a time (H200, CUPTI).

    PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu python3 -m benchmarks.adam_kernels

XLA's Adam step (benchmarks/gpu_suite.py ``adam_step``) took 175 µs of kernels per step
against hlotk's 197-212 (NOTES, session 7). Here one parameter of each suite shape is
updated alone (p, g, m, v in; p, m, v out; f32), by jax.jit and by hlotk (its default
emitter, Triton only, CUDA C only), and CUPTI gives
each kernel's duration, grid, block and registers, back-to-back, inputs L2-warm (``SIDES``:
the CUDA C flat form's launch and source variants, and its strided form). A row's
GB/s counts 7 arrays of the parameter's bytes (4 read, 3 written). Every result is checked
against jax.jit's.
"""
from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")

import numpy as np  # noqa: E402

SHAPES = [(1536, 1536), (1536, 768), (6144,)]
# hlotk's sides: a label and the environment its executable is compiled under. The CUDA C
# flat form (codegen/cuda_c/flat.py) at its default launch, at 128 threads a block, with
# the grid capped at one wave (grid-stride), with const __restrict__ inputs, and the strided form.
SIDES = [("hlotk", {}), ("triton", {"HLOTK_LOOP_EMITTER": "triton"}),
         ("cuda flat", {"HLOTK_LOOP_EMITTER": "cuda"}),
         ("cuda flat 128", {"HLOTK_LOOP_EMITTER": "cuda", "HLOTK_CUDA_C_FLAT_LAUNCH": "128"}),
         ("cuda flat 1 wave", {"HLOTK_LOOP_EMITTER": "cuda",
                               "HLOTK_CUDA_C_FLAT_LAUNCH": "256/1"}),
         ("cuda flat restrict", {"HLOTK_LOOP_EMITTER": "cuda", "HLOTK_CUDA_C_RESTRICT": "1"}),
         ("cuda strided", {"HLOTK_LOOP_EMITTER": "cuda", "HLOTK_CUDA_C_FLAT": "0"})]


def step(p, g, m, v, c):
    import jax.numpy as jnp
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    p = p - 1e-3 * (m / (1 - 0.9 ** c)) / (jnp.sqrt(v / (1 - 0.999 ** c)) + 1e-8)
    return p, m, v


def main() -> None:
    import argparse
    import jax
    ap = argparse.ArgumentParser()
    ap.add_argument("--sides", default="", help="comma-separated labels of SIDES (default all)")
    opts = ap.parse_args()
    wanted = [s for s in opts.sides.split(",") if s]
    unknown = set(wanted) - {label for label, _ in SIDES}
    if unknown:
        raise SystemExit(f"--sides: unknown {sorted(unknown)}; known {[s for s, _ in SIDES]}")
    sides_run = [s for s in SIDES if not wanted or s[0] in wanted]

    import runtime
    from benchmarks.loop_configs import trace
    rng = np.random.default_rng(0)
    rows = []
    for shape in SHAPES:
        args = [jax.device_put(rng.standard_normal(shape).astype(np.float32) * s)
                for s in (0.02, 1e-3, 1e-4)] + \
            [jax.device_put(np.abs(rng.standard_normal(shape)).astype(np.float32) * 1e-6),
             jax.device_put(np.float32(3.0))]
        want = jax.jit(step)(*args)
        sides = {"XLA": jax.jit(step)}
        for label, env in sides_run:
            old = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                sides[label] = runtime.jit(step, backend="cuda").lower(*args).compile()
            finally:
                for k, v in old.items():
                    os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        nbytes = 7 * int(np.prod(shape)) * 4
        for label, f in sides.items():
            for _ in range(3):
                got = f(*args)
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-8)
            recs = trace(lambda: jax.block_until_ready(f(*args)), 30)
            by: dict = {}
            for r in recs:
                by.setdefault((r["name"][:48], str(r["grid"]), str(r["block"]), r["regs"]),
                              []).append(r["dur"])
            for (name, grid, block, regs), durs in sorted(by.items(), key=lambda kv: -sum(kv[1])):
                us = statistics.median(durs)
                rows.append((str(shape), label, name, grid, block, regs, us,
                             nbytes / (us * 1e3) if us > 0.5 else 0.0))
    print("| shape | side | kernel | grid | block | regs | µs | GB/s (7 arrays) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]:.2f} | "
              f"{r[7]:.0f} |")


if __name__ == "__main__":
    main()

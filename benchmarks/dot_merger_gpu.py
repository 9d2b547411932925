"""Issue 14, dot-merger on the GPU: the suite's transformer and two programs not in the
suite with a q/k/v projection (a grouped-query block whose k and v weights are narrower
than q's; a cross-attention block where only k and v read the same context), each through
hlotk with and without ``dot-merger`` and through jax.jit in one process.

    python -m benchmarks.dot_merger_gpu [--seq] [--programs] [--out DIR]

``--seq``: one call's kernels with the idle gap before each (CUPTI), transformer, hlotk
with and without the pass and XLA. ``--programs``: do_bench / cold wall / device time of
the two other programs (benchmarks.gpu_suite.run_one), both pipelines and jax.jit.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np


def without_merger() -> str:
    """The CUDA default pipeline (without dot-merger)."""
    from passes.pipelines import pipeline_spec
    return pipeline_spec("default", "cuda")


def with_merger() -> str:
    """The CUDA default pipeline with dot-merger (the comparison in the same run)."""
    from passes.pipelines import pipeline_spec, with_dot_merger
    return with_dot_merger(pipeline_spec("default", "cuda"))


def programs() -> list[tuple]:
    """(name, label, fn, args, min bytes, flops, flop kind, tolerance) as gpu_suite's."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    import ml_dtypes
    bf16 = ml_dtypes.bfloat16
    r = np.random.default_rng(0)

    def b16(*s, scale=1.0):
        return (r.standard_normal(s) * scale).astype(bf16)

    def ln(x):
        xf = x.astype(jnp.float32)
        mu = xf.mean(-1, keepdims=True)
        var = ((xf - mu) ** 2).mean(-1, keepdims=True)
        return ((xf - mu) * lax.rsqrt(var + 1e-5)).astype(x.dtype)

    def attend(q, k, v, causal):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")

    def gqa_block(p, x):
        """Pre-LN causal grouped-query attention: 16 query heads, 4 K/V heads of 128."""
        B, S, D = x.shape
        h = ln(x)
        q = (h @ p["wq"]).reshape(B, S, 16, 128)
        k = (h @ p["wk"]).reshape(B, S, 4, 128)
        v = (h @ p["wv"]).reshape(B, S, 4, 128)
        return x + attend(q, k, v, True).reshape(B, S, D) @ p["wo"]

    def cross_block(p, x, ctx):
        """Cross-attention: q from x, k and v from a context of 512 positions."""
        B, S, D = x.shape
        q = (ln(x) @ p["wq"]).reshape(B, S, 16, 64)
        k = (ctx @ p["wk"]).reshape(B, -1, 16, 64)
        v = (ctx @ p["wv"]).reshape(B, -1, 16, 64)
        return x + attend(q, k, v, False).reshape(B, S, D) @ p["wo"]

    D = 2048
    gp = {"wq": b16(D, D, scale=D ** -0.5), "wk": b16(D, 512, scale=D ** -0.5),
          "wv": b16(D, 512, scale=D ** -0.5), "wo": b16(D, D, scale=D ** -0.5)}
    gx = b16(8, 1024, D)
    g_flops = 2 * 8192 * D * (2 * D + 1024) + 2 * 2 * 8 * 16 * 1024 * 1024 * 128 // 2
    E = 1024
    cp = {k: b16(E, E, scale=E ** -0.5) for k in ("wq", "wk", "wv", "wo")}
    cx, cctx = b16(8, 1024, E), b16(8, 512, E)
    c_flops = 2 * 8192 * E * E * 2 + 2 * 4096 * E * E * 2 + 2 * 2 * 8 * 16 * 1024 * 512 * 64
    return [
        ("gqa_block", "pre-LN GQA block bf16 B8 S1024 D2048, 16 q heads / 4 kv heads of 128, "
         "causal", gqa_block, (gp, gx), 2 * (2 * gx.size + sum(w.size for w in gp.values())),
         g_flops, "bf16", 3e-2),
        ("cross_block", "cross-attention bf16 B8 S1024 ctx 512 D1024, 16 heads", cross_block,
         (cp, cx, cctx), 2 * (2 * cx.size + cctx.size + 4 * E * E), c_flops, "bf16", 3e-2),
    ]


def seq(out_dir: str) -> None:
    from benchmarks.gpu_suite import programs as suite
    from benchmarks.kernel_profile import format_sequence, kernel_table
    p = [p for p in suite() if p[0] == "transformer"][0]
    res = kernel_table(p[2], p[3], steps=6, pipeline=with_merger())
    res.update(kernel_table(p[2], p[3], steps=6, pipeline=without_merger(), xla=False,
                            tag="hlotk_no_merger"))
    for tag in ("hlotk", "hlotk_no_merger", "xla"):
        r = res[tag]
        names = {k["name"]: k["thunks"] for k in r["kernels"] if k["thunks"]}
        print(f"== transformer {tag}: sum {r['sum_us']:.1f} span {r['span_us']:.1f} "
              f"launches {r['launches']:.0f}")
        print(format_sequence(r["sequence"], names))
    with open(os.path.join(out_dir, "seq.json"), "w") as fh:
        json.dump(res, fh, indent=1, default=str)


def timed(out_dir: str) -> None:
    """do_bench, cold wall and device time of each program: jax.jit once, hlotk with and
    without dot-merger, results checked against jax.jit's."""
    import jax
    import runtime
    from benchmarks.gpu_suite import bench, device_ms, rel_err, wall_ms
    from runtime.cuda import executable_of
    rows = []
    for name, label, fn, args, _, _, _, tol in programs():
        dev_args = jax.device_put(args)
        xc = jax.jit(fn).lower(*dev_args).compile()
        want = jax.block_until_ready(xc(*dev_args))
        row = {"name": name, "label": label,
               "xla_ms": bench(lambda: jax.block_until_ready(xc(*dev_args)), rep=100),
               "xla_wall": wall_ms(lambda: jax.block_until_ready(xc(*dev_args)), reps=50)}
        for tag, pipe in (("merged", with_merger()), ("no_merger", without_merger())):
            hc = runtime.jit(fn, backend="cuda", pipeline=pipe).lower(*dev_args).compile()
            for _ in range(4):
                got = jax.block_until_ready(hc(*dev_args))
            exe = executable_of(hc)
            row[tag] = {"err": rel_err(got, want),
                        "ms": bench(lambda: jax.block_until_ready(hc(*dev_args)), rep=100),
                        "wall": wall_ms(lambda: jax.block_until_ready(hc(*dev_args)), reps=50),
                        "device_ms": device_ms(exe), "kernels": exe.kernel_count(),
                        "host_fallbacks": len(exe.host_fallbacks())}
            r = row[tag]
            print(f"{name} {tag}: hlotk {r['ms']:.3f} ms vs XLA {row['xla_ms']:.3f} "
                  f"({r['ms'] / row['xla_ms']:.2f}); cold wall {r['wall']:.3f} / "
                  f"{row['xla_wall']:.3f} ({r['wall'] / row['xla_wall']:.2f}); device "
                  f"{r['device_ms']:.3f} ms; err {r['err']:.2e} (tol {tol}); kernels "
                  f"{r['kernels']}; host fallbacks {r['host_fallbacks']}", flush=True)
        rows.append(row)
    with open(os.path.join(out_dir, "programs.json"), "w") as fh:
        json.dump(rows, fh, indent=1, default=str)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", action="store_true")
    ap.add_argument("--programs", action="store_true")
    ap.add_argument("--out", default=".")
    opts = ap.parse_args()
    if opts.seq:
        seq(opts.out)
    if opts.programs:
        timed(opts.out)


if __name__ == "__main__":
    main()

"""Transformer MLPs whose activation (and bias) cuBLASLt applies in its GEMM epilogue, hlotk
against jax.jit in the same process (issue 14; GPU).

    python -m benchmarks.gemm_epilogues [--out benchmarks/gemm_epilogues.md]

Programs not in the suite, as users write them (bf16, x [8, 1024, 1024], hidden 4096, with
the residual): a GELU MLP without biases, GPT-2's MLP (bias + GELU, then bias), a ReLU MLP
with biases. Each row: relative error against jax.jit, do_bench and cold-wall medians of
both (``gpu_suite``'s measures), hlotk's device time (graph replay), and the library calls
that took an epilogue.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")


def programs() -> list:
    import jax
    import ml_dtypes
    import numpy as np
    r = np.random.default_rng(0)
    bf = ml_dtypes.bfloat16
    b, s, d, f = 8, 1024, 1024, 4096

    def w(*shape, scale=1.0):
        return (r.standard_normal(shape) * scale).astype(bf)
    x = w(b, s, d)
    w1, w2 = w(d, f, scale=d ** -0.5), w(f, d, scale=f ** -0.5)
    b1, b2 = w(f, scale=0.1), w(d, scale=0.1)

    def gelu_mlp(x, w1, w2):
        return x + jax.nn.gelu(x @ w1, approximate=True) @ w2

    def gpt2_mlp(x, w1, b1, w2, b2):
        return x + (jax.nn.gelu(x @ w1 + b1, approximate=True) @ w2 + b2)

    def relu_mlp(x, w1, b1, w2, b2):
        return x + jax.nn.relu(x @ w1 + b1) @ w2 + b2
    return [("GELU MLP, no bias", gelu_mlp, (x, w1, w2)),
            ("GPT-2 MLP: bias + GELU, bias", gpt2_mlp, (x, w1, b1, w2, b2)),
            ("ReLU MLP with biases", relu_mlp, (x, w1, b1, w2, b2))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/gemm_epilogues.md")
    opts = ap.parse_args()
    import jax
    import torch

    import runtime
    from benchmarks.gpu_suite import bench, device_ms, rel_err, wall_ms
    from runtime.cuda import executable_of
    rows = []
    for name, fn, args in programs():
        dev = jax.device_put(args)
        xc = jax.jit(fn).lower(*dev).compile()
        want = jax.block_until_ready(xc(*dev))
        hc = runtime.jit(fn, backend="cuda").lower(*dev).compile()
        got = jax.block_until_ready(hc(*dev))
        exe = executable_of(hc)
        epilogues = [t.label() for t in exe.thunks() if "epilogue" in t.label()]
        row = {"name": name, "err": rel_err(got, want),
               "hl": bench(lambda: jax.block_until_ready(hc(*dev))),
               "xla": bench(lambda: jax.block_until_ready(xc(*dev))),
               "hl_wall": wall_ms(lambda: jax.block_until_ready(hc(*dev))),
               "xla_wall": wall_ms(lambda: jax.block_until_ready(xc(*dev))),
               "device": device_ms(exe), "epilogues": epilogues}
        rows.append(row)
        print(row, flush=True)
    lines = ["# GEMM epilogues (issue 14): transformer MLPs, hlotk vs jax.jit", "",
             f"Device: {torch.cuda.get_device_name()}; bf16 x [8,1024,1024], hidden 4096; "
             "ms medians (do_bench; cold wall: idle GPU, flushed L2, to the result).", "",
             "| program | rel err | hlotk ms | XLA ms | ratio | cold wall hlotk / XLA (ratio) "
             "| hlotk device ms | epilogues |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['err']:.1e} | {r['hl']:.3f} | {r['xla']:.3f} | "
                     f"{r['hl'] / r['xla']:.2f} | {r['hl_wall']:.3f} / {r['xla_wall']:.3f} "
                     f"({r['hl_wall'] / r['xla_wall']:.2f}) | {r['device']:.3f} | "
                     f"{'; '.join(r['epilogues']) or '-'} |")
    with open(opts.out, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Temp memory of hlotk's buffer assignment next to XLA:CPU's and the lower bound.

    python -m benchmarks.memory_report            # writes benchmarks/memory_report.md

For every zoo program and small versions of the GPU benchmark programs: hlotk's temp arena
(``runtime.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes``, default
pipeline), XLA's (``jax.jit(f).lower(*args).compile().memory_analysis()``, CPU), and the
no-fragmentation lower bound of hlotk's own buffers (peak of live aligned bytes).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import runtime
from passes.pipelines import SIMPLIFY, pipeline_spec

# The default pipeline while layout assignment and fusion are not in it yet, with them
# added before the scheduler (as XLA runs them).
_DEFAULT = pipeline_spec("default", "cpu")
FUSED = (_DEFAULT if "fusion" in _DEFAULT
         else f"inline,{SIMPLIFY},layout-assignment,fusion,schedule")


def _bench_programs() -> list[tuple[str, Callable, tuple]]:
    r = np.random.RandomState(0)
    bf16 = jnp.bfloat16

    def softmax(x):
        return jax.nn.softmax(x, axis=-1)

    def layer_norm(x, g, b):
        x32 = x.astype(jnp.float32)
        m = x32.mean(-1, keepdims=True)
        v = ((x32 - m) ** 2).mean(-1, keepdims=True)
        return ((x32 - m) * jax.lax.rsqrt(v + 1e-5) * g + b).astype(bf16)

    def gelu_mlp(x, w1, w2):
        return jax.nn.gelu(x @ w1) @ w2

    def scaled_neg(a, b):
        return -((a.astype(bf16) @ b) * 0.125)

    from tests.zoo import giou_boxes as giou  # the zoo's GIOU, at the benchmark's sizes

    def int8_matmul(a, b):
        return jax.lax.dot(a, b, preferred_element_type=jnp.int32)

    def transformer(p, x):
        def ln(h):
            m = h.mean(-1, keepdims=True)
            return (h - m) * jax.lax.rsqrt(((h - m) ** 2).mean(-1, keepdims=True) + 1e-5)
        q, k, v = ln(x) @ p["wq"], ln(x) @ p["wk"], ln(x) @ p["wv"]
        att = jax.nn.softmax(q @ k.T / np.sqrt(q.shape[-1]), axis=-1)
        h = x + (att @ v) @ p["wo"]
        return h + jax.nn.gelu(ln(h) @ p["w1"]) @ p["w2"]

    def mlp_step(p, x, y):
        def loss(p):
            h = jnp.tanh(x @ p["w1"] + p["b1"])
            return ((h @ p["w2"] - y) ** 2).mean()
        g = jax.grad(loss)(p)
        return jax.tree_util.tree_map(lambda a, b: a - 0.01 * b, p, g)

    def boxes(n):
        lo = r.rand(n, 16, 2).astype(np.float32)
        return np.concatenate([lo, lo + r.rand(n, 16, 2).astype(np.float32) + 0.1], -1)

    d = 64
    tparams = {k: (r.randn(*s) * 0.1).astype(np.float32) for k, s in
               dict(wq=(d, d), wk=(d, d), wv=(d, d), wo=(d, d), w1=(d, 4 * d), w2=(4 * d, d)).items()}
    mparams = {"w1": r.randn(32, 64).astype(np.float32), "b1": np.zeros(64, np.float32),
               "w2": r.randn(64, 8).astype(np.float32)}
    return [
        ("bench/softmax f32[256,512]", softmax, (r.randn(256, 512).astype(np.float32),)),
        ("bench/layer_norm bf16[256,512]", layer_norm,
         (r.randn(256, 512).astype(bf16), np.ones(512, np.float32), np.zeros(512, np.float32))),
        ("bench/gelu_mlp bf16", gelu_mlp, (r.randn(128, 256).astype(bf16),
                                           (r.randn(256, 1024) * 0.05).astype(bf16),
                                           (r.randn(1024, 256) * 0.05).astype(bf16))),
        ("bench/s8@bf16 scaled neg", scaled_neg, (r.randint(-8, 8, (64, 32)).astype(np.int8),
                                                 r.randn(32, 128).astype(bf16))),
        ("bench/giou f32[64,16,4]", giou, (boxes(64), boxes(64))),
        ("bench/int8 matmul [256,256]", int8_matmul,
         (r.randint(-100, 100, (256, 256)).astype(np.int8),
          r.randint(-100, 100, (256, 256)).astype(np.int8))),
        ("bench/transformer block d=64", transformer,
         (tparams, r.randn(32, d).astype(np.float32))),
        ("bench/mlp train step f32", mlp_step,
         (mparams, r.randn(16, 32).astype(np.float32), r.randn(16, 8).astype(np.float32))),
    ]


def _programs() -> list[tuple[str, Callable, tuple, Any]]:
    from tests.zoo import ZOO, x64_scope
    out = [(f"zoo/{p.name}", p.fn, None, p) for p in ZOO]
    out += [(n, f, a, None) for n, f, a in _bench_programs()]
    return out


def measure() -> list[dict]:
    from contextlib import nullcontext
    from tests.zoo import x64_scope
    rows = []
    for name, fn, args, prog in _programs():
        scope = x64_scope(prog) if prog is not None else nullcontext()
        with scope:
            a = prog.args() if prog is not None else args
            t0 = time.perf_counter()
            xla = jax.jit(fn).lower(*a).compile().memory_analysis()
            plain = runtime.jit(fn).lower(*a).compile().memory_analysis()
            ours = runtime.jit(fn, pipeline=FUSED).lower(*a).compile()
            mem = ours.memory_analysis()
            ba = ours.buffer_assignment()
            step, peak, at = ba.peak()
            rows.append(dict(name=name, ours=mem.temp_size_in_bytes,
                             plain=plain.temp_size_in_bytes,
                             xla=xla.temp_size_in_bytes if xla is not None else None,
                             bound=mem.temp_lower_bound_in_bytes,
                             fusions=sum(1 for i in ours.module.all_instructions()
                                         if i.opcode == "fusion"),
                             peak_buffers=", ".join(f"{b.name} ({b.size})" for b in at[:3]),
                             seconds=time.perf_counter() - t0))
    return rows


def report(rows: list[dict]) -> str:
    n_le = sum(1 for r in rows if r["xla"] is not None and r["ours"] <= r["xla"])
    n_bound = sum(1 for r in rows if r["ours"] == r["bound"])
    lines = [
        "# Temp memory: hlotk buffer assignment vs XLA:CPU",
        "",
        "Produced by `python -m benchmarks.memory_report`. Bytes of the temp allocation:",
        "hlotk's arena (default pipeline; 64-byte alignment; best of spatial/temporal best fit),",
        "XLA:CPU's `memory_analysis().temp_size_in_bytes` for `jax.jit(f)` on the same",
        "arguments, and the no-fragmentation lower bound of hlotk's own buffers.",
        "",
        f"ours <= XLA on {n_le} of {len(rows)} programs; ours == lower bound on {n_bound}.",
        "",
        f"hlotk temp: pipeline `{FUSED}`; 'unfused': the committed default pipeline",
        f"`{_DEFAULT}`.",
        "",
        "| program | hlotk temp | XLA temp | lower bound | ours/XLA | hlotk unfused | fusions | buffers at the peak |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ratio = (f"{r['ours'] / r['xla']:.2f}" if r["xla"] else ("=" if r["ours"] == 0 else "inf"))
        mark = "" if r["xla"] is None or r["ours"] <= r["xla"] else " **>**"
        lines.append(f"| {r['name']} | {r['ours']}{mark} | {r['xla']} | {r['bound']} | {ratio} | "
                     f"{r['plain']} | {r['fusions']} | {r['peak_buffers']} |")
    lines += ["", "## Where hlotk needs more than XLA, and why", "", *NOTES]
    return "\n".join(lines) + "\n"


NOTES = [
    "- **while loops** (scan_rnn, while_loop_newton, fori_loop): hlotk's copy insertion is",
    "  conservative: every loop-state leaf the body changes is computed into a temporary and",
    "  then copied into the state buffer (after control edges to every reader of the old",
    "  state). XLA writes the new value straight into the state buffer when its live range",
    "  does not interfere with the old value's, so it needs no temporary and no copy.",
    "- **top_k**: XLA:CPU calls a TopK library routine writing straight into the outputs; hlotk",
    "  imports it as iota + sort + slices, whose iota and sorted keys are temporaries.",
    "- **cnn_nhwc, fft_family, linalg_qr**: small differences (32-192 B): the 64-byte",
    "  alignment of every temp in hlotk's arena, and small tuple-shaped results (custom calls,",
    "  multi-output fusions) whose leaves XLA places without padding.",
    "- Everywhere else hlotk's arena is at or below XLA's and equals its own no-fragmentation",
    "  lower bound: best fit over few buffers leaves no holes.",
]


def main(argv: list[str] | None = None) -> int:
    rows = measure()
    text = report(rows)
    out = Path(__file__).with_name("memory_report.md")
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

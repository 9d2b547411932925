"""Plain JAX attention through hlotk's flash-attention fusion vs jax.jit, same run, H200.

``python -m benchmarks.attention`` prints tables. Kernel section (``--only kernel``): the
issue's causal attention B2 H16 S4096 D128 bf16 (einsum, where-mask, f32 softmax, einsum),
each row one way of timing it, all in one process:

- ``kernel alone``: hlotk's Triton kernel launched from torch (``flash_attention`` on the
  fusion), median of ``triton.testing.do_bench`` (CUDA events on torch's stream, L2 flushed
  before each call);
- ``pipelined``: ``runtime.jit(f, backend="cuda")`` / ``jax.jit(f)`` called N times back to
  back with one ``block_until_ready`` at the end, per call, median of several rounds (how
  a training loop runs: the host dispatch of the next call overlaps the device work of
  this one, and the wait for the result is paid once);
- ``blocked``: one call from an idle GPU with a flushed L2 to its result being ready
  (host clock, ``gpu_suite.wall_ms``): dispatch + device time + JAX's readiness lag
  (~0.1 ms on the H200, benchmarks/NOTES.md, issue 12's call timeline);
- ``torch SDPA``: ``scaled_dot_product_attention(is_causal=True)`` on [B, H, S, D] views
  of the same tensors, do_bench and pipelined.

(do_bench around a JAX call that is not blocked times torch's stream, not JAX's: the events
bracket nothing JAX launched, so it is not used for the end-to-end rows.) Also the
32k-vocabulary cross-entropy (hlotk vs XLA), with ``--only suite`` gpu_suite's rows, and
with ``--only dpa`` ``jax.nn.dot_product_attention`` (MHA and Llama-style GQA, and the GQA
gradient) through hlotk beside jax.jit's XLA and cuDNN implementations.
"""
from __future__ import annotations

import sys

import numpy as np


def causal_attention(q, k, v):
    import jax
    import jax.numpy as jnp
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(q.shape[-1])
    n = q.shape[1]
    s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -1e30)
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def cross_entropy(x, labels):
    import jax
    import jax.numpy as jnp
    lp = jax.nn.log_softmax(x.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(lp, labels[:, None], axis=-1)[:, 0]


def masked_mean_nll(x, labels, ignore=-100):
    """Mean NLL with an ignore-index mask (the usual LM loss), logits in their own dtype."""
    import jax
    import jax.numpy as jnp
    valid = labels != ignore
    lp = jax.nn.log_softmax(x.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(lp, jnp.where(valid, labels, 0)[:, None], axis=-1)[:, 0]
    return -jnp.sum(jnp.where(valid, picked, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


def transformer_train_step(heads: int):
    """A transformer block's training step as people write it (embedding-free): f32 master
    weights cast to bf16 for the matmuls, layer norms in f32, causal attention (einsum,
    where-mask, f32 softmax, einsum), gelu MLP, mean-squared-error loss, jax.grad w.r.t.
    every weight, then an Adam update (gpu_suite.adam_step). Returns
    step(params, m, v, count, x, y) -> (params, m, v, count, loss)."""
    import jax
    import jax.numpy as jnp
    from benchmarks.gpu_suite import adam_step
    bf16 = jnp.bfloat16

    def ln(x, g, b):
        xf = x.astype(jnp.float32)
        mu = xf.mean(-1, keepdims=True)
        var = ((xf - mu) ** 2).mean(-1, keepdims=True)
        return ((xf - mu) * jax.lax.rsqrt(var + 1e-5) * g + b).astype(bf16)

    def block(p, x):
        B, S, D = x.shape
        w = {k: v.astype(bf16) for k, v in p.items() if v.ndim == 2}
        h = ln(x, p["ln1_g"], p["ln1_b"])
        q, k, v = ((h @ w[n]).reshape(B, S, heads, D // heads) for n in ("wq", "wk", "wv"))
        o = causal_attention(q, k, v).reshape(B, S, D)
        x = x + o @ w["wo"]
        h = ln(x, p["ln2_g"], p["ln2_b"])
        return x + jax.nn.gelu(h @ w["w1"], approximate=True) @ w["w2"]

    def step(params, m, v, count, x, y):
        def loss_fn(p):
            return jnp.mean((block(p, x).astype(jnp.float32) - y) ** 2)
        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, m, v, count = adam_step(params, grads, m, v, count)
        return params, m, v, count, loss
    return step


def transformer_train_args(b: int, s: int, d: int, seed: int = 0) -> tuple:
    """(params, m, v, count, x, y) for transformer_train_step: f32 weights, bf16 x."""
    import ml_dtypes
    r = np.random.default_rng(seed)

    def f32(*shape, scale=1.0):
        return (r.standard_normal(shape) * scale).astype(np.float32)
    p = {"ln1_g": 1 + f32(d, scale=0.1), "ln1_b": f32(d, scale=0.1),
         "ln2_g": 1 + f32(d, scale=0.1), "ln2_b": f32(d, scale=0.1),
         "wq": f32(d, d, scale=d ** -0.5), "wk": f32(d, d, scale=d ** -0.5),
         "wv": f32(d, d, scale=d ** -0.5), "wo": f32(d, d, scale=d ** -0.5),
         "w1": f32(d, 4 * d, scale=d ** -0.5), "w2": f32(4 * d, d, scale=(4 * d) ** -0.5)}
    zeros = {k: np.zeros_like(a) for k, a in p.items()}
    return (p, zeros, dict(zeros), np.float32(0), f32(b, s, d).astype(ml_dtypes.bfloat16),
            f32(b, s, d))


def attention_grad(q, k, v):
    """jax.grad of sum(o²) w.r.t. q, k, v for the causal attention (f32 loss)."""
    import jax
    import jax.numpy as jnp
    return jax.grad(lambda q, k, v: jnp.sum(causal_attention(q, k, v).astype(jnp.float32)
                                            ** 2), argnums=(0, 1, 2))(q, k, v)


# --baseline: no-split-gemms is the CUDA pipeline without split GEMM fusions priced as such;
# main is the pipeline before i14-step (no split_gemms, no split-reductions).
BASELINES = {"no-split-gemms": lambda spec: spec.replace(",split_gemms=true", ""),
             "main": lambda spec: spec.replace(",split_gemms=true", "")
                                      .replace("split-reductions,", "")}


def baseline_spec(name_or_spec: str) -> str:
    from passes.pipelines import PIPELINES
    make = BASELINES.get(name_or_spec)
    return make(PIPELINES["default"]["cuda"]) if make else name_or_spec


def train_program() -> tuple:
    """(fn, args) of the suite's transformer training step."""
    return transformer_train_step(16), transformer_train_args(4, 2048, 1024)


def suite_programs() -> list[tuple]:
    """Issue 14's GPU programs, in gpu_suite's tuple format: the forward attention, jax.grad
    of it, and the transformer training step (also benchmarks/compile_time.py's)."""
    import ml_dtypes
    b, h, s, d = 2, 16, 4096, 128
    r = np.random.default_rng(0)
    qkv = tuple(r.standard_normal((b, s, h, d)).astype(ml_dtypes.bfloat16) for _ in range(3))
    attn_flops = 4 * b * h * s * s * d / 2          # causal: half the square
    tb, ts, tm, th = 4, 2048, 1024, 16
    tokens = tb * ts
    train_flops = 3 * (2 * tokens * (4 * tm * tm + 8 * tm * tm)) + \
        3.5 * 4 * tb * th * ts * ts * (tm // th) / 2      # fwd + 2x bwd; +recompute of P
    return [
        ("attn_fwd", "causal attention B2 H16 S4096 D128 bf16, forward", causal_attention,
         qkv, 4 * b * s * h * d * 2, attn_flops, "bf16", 3e-2),
        ("attn_grad", "jax.grad of the causal attention (sum o^2), B2 H16 S4096 D128 bf16",
         attention_grad, qkv, 7 * b * s * h * d * 2, 3.5 * attn_flops, "bf16", 3e-2),
        ("transformer_train", f"transformer training step B{tb} S{ts} D{tm} H{th} (Dh64), "
         "f32 weights, bf16 matmuls, causal attn, gelu MLP, MSE, grad + Adam",
         transformer_train_step(th), transformer_train_args(tb, ts, tm), 0, train_flops,
         "bf16", 3e-2),
    ]


def suite_rows(ceil: dict, baseline: str = "", only: str = "") -> list[dict]:
    """Issue 14's GPU programs through gpu_suite.run_one (do_bench, wall_ms, device time,
    profile, kernels, host fallbacks, temp, error vs jax.jit): the forward attention end
    to end, jax.grad of it, and the transformer training step (also through the
    ``baseline`` pipeline spec when given, in the same process)."""
    from benchmarks.gpu_suite import run_one
    progs = suite_programs()
    if baseline:
        progs.append(("train_baseline", progs[-1][1] + f" [pipeline {baseline}]") + progs[-1][2:])
    if only:
        progs = [p for p in progs if p[0] in only.split(",")]
    rows = []
    for prog in progs:
        try:
            spec = baseline_spec(baseline) if prog[0] == "train_baseline" else ""
            rows.append(run_one(prog, ceil, autotune=True, pipeline=spec))
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            rows.append({"name": prog[0], "error": f"{type(e).__name__}: {e}"})
        print(rows[-1].get("name"), {k: v for k, v in rows[-1].items()
                                     if k not in ("report", "profile")}, flush=True)
        print(rows[-1].get("profile", ""), flush=True)
    from codegen.triton.attention import _TUNED
    print("tuned flash configs:", {str(k[1:]): v for k, v in _TUNED.items()}, flush=True)
    return rows


def sdpa_ms() -> dict:
    """torch SDPA (reference) on the long causal attention: forward, forward+backward."""
    import torch
    from benchmarks.gpu_suite import bench
    q, k, v = (torch.randn(2, 16, 4096, 128, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    fwd = bench(lambda: sdpa(q, k, v, is_causal=True))
    both = bench(lambda: torch.autograd.grad(sdpa(q, k, v, is_causal=True), (q, k, v), do))
    return {"sdpa_fwd": fwd, "sdpa_fwd_bwd": both, "sdpa_bwd": both - fwd}


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="kernel,xent,suite",
                    help="comma-separated sections: kernel (flash kernel alone, SDPA), xent "
                         "(cross-entropy), suite (forward/grad/training step via run_one), "
                         "dpa (jax.nn.dot_product_attention vs XLA and cuDNN; dpa_fwd: "
                         "without the gradient rows), gqa_forms "
                         "(grouped einsum in both group orders), window (sliding-window "
                         "attention, S8192 window 1024, beside full causal)")
    ap.add_argument("--out", default="")
    ap.add_argument("--kernels", action="store_true",
                    help="with suite: per-kernel device time of the training step (CUPTI "
                         "via torch.profiler, kernels inside hlotk's CUDA graph) beside XLA's")
    ap.add_argument("--baseline", default="",
                    help="also run the training step through this pipeline spec (or "
                         "'no-split-gemms', 'main') in the same process, as the 'before'")
    ap.add_argument("--programs", default="", help="suite programs to run (default all): "
                    "attn_fwd,attn_grad,transformer_train,train_baseline")
    opts = ap.parse_args()
    only = set(opts.only.split(","))
    if "suite" in only:
        import json
        from benchmarks.gpu_suite import ceilings
        ceil = ceilings()
        names = set(filter(None, opts.programs.split(",")))
        sdpa = sdpa_ms() if not names or names & {"attn_fwd", "attn_grad"} else \
            {"sdpa_fwd": float("nan"), "sdpa_fwd_bwd": float("nan"), "sdpa_bwd": float("nan")}
        suite = suite_rows(ceil, opts.baseline, opts.programs)
        kernels = kernel_section(opts) if opts.kernels else {}
        if opts.out:
            with open(opts.out, "w") as fh:
                json.dump({"sdpa": sdpa, "rows": suite, "kernels": kernels}, fh, indent=1,
                          default=str)
        print(f"torch SDPA causal B2 H16 S4096 D128 bf16: fwd {sdpa['sdpa_fwd']:.3f} ms, "
              f"fwd+bwd {sdpa['sdpa_fwd_bwd']:.3f} ms (bwd ~{sdpa['sdpa_bwd']:.3f})")
        print(f"{'program':18s} {'ok':>3s} {'err':>8s} {'hlotk':>7s} {'xla':>7s} {'ratio':>5s} "
              f"{'h wall':>7s} {'x wall':>7s} {'w ratio':>7s} {'dev ms':>7s} {'host':>4s} "
              f"{'temp MiB':>8s} kernels")
        for r in suite:
            if "error" in r:
                print(f"{r['name']:18s} ERROR {r['error'][:100]}")
                continue
            print(f"{r['name']:18s} {str(r['ok'])[:3]:>3s} {r['err']:8.1e} {r['hlotk_ms']:7.3f} "
                  f"{r['xla_ms']:7.3f} {r['hlotk_ms'] / r['xla_ms']:5.2f} "
                  f"{r['hlotk_wall']:7.3f} {r['xla_wall']:7.3f} "
                  f"{r['hlotk_wall'] / r['xla_wall']:7.2f} {r['device_ms']:7.3f} "
                  f"{r['host_fallbacks']:4d} {r['temp'] / 2**20:8.1f} {r['kernels']}")
        sys.stdout.flush()
    if only & {"kernel", "xent"}:
        kernel_and_xent(only)
    if only & {"dpa", "dpa_fwd"}:
        dpa_section(grad="dpa" in only)
    if "gqa_forms" in only:
        gqa_forms_section()
    if "window" in only:
        window_section()


def window_pairs(s: int, w: int) -> int:
    """(q, k) pairs a causal window of ``w`` keys (q-w+1..q) keeps over ``s`` positions."""
    return sum(min(q + 1, w) for q in range(s))


def window_section(b: int = 2, s: int = 8192, h: int = 16, d: int = 128, w: int = 1024) -> None:
    """``--only window``: sliding-window (local) causal attention, bf16 B2 H16 S8192 D128,
    window 1024 (jax.nn local_window_size=(1023, 0), and the same as two iota compares):
    hlotk vs jax.jit (XLA) and cuDNN, forward and value_and_grad, beside hlotk's full
    causal attention at the same shape; pipelined per-call ms. TFLOP/s count the kept
    (q, k) pairs only (4·d flops each forward, 3.5x that with the gradient)."""
    import jax
    import jax.numpy as jnp

    import runtime
    from passes.fusion import fusion_kind
    ks = jax.random.split(jax.random.PRNGKey(5), 4)
    q, k, v, do = (jax.random.normal(kk, (b, s, h, d), jnp.bfloat16) for kk in ks)
    win_flops = 4 * b * h * d * window_pairs(s, w)
    causal_flops = 4 * b * h * d * s * (s + 1) / 2

    def dpa(window: bool, impl: str = "xla"):
        kw = dict(local_window_size=(w - 1, 0)) if window else {}
        return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                            implementation=impl, **kw)

    def compares(q, k, v):
        pos = jnp.arange(s)
        keep = (pos[:, None] >= pos[None, :]) & (pos[:, None] - pos[None, :] < w)
        sc = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / d ** 0.5
        p = jax.nn.softmax(jnp.where(keep, sc, -jnp.inf), axis=-1).astype(v.dtype)
        return jnp.einsum("bhqk,bkhd->bqhd", p, v)

    def vg(f):
        return jax.value_and_grad(lambda q, k, v, do: jnp.sum(
            f(q, k, v).astype(jnp.float32) * do.astype(jnp.float32)), argnums=(0, 1, 2))
    rows = []
    cases = [("jax.nn window", dpa(True), win_flops, True),
             ("jax.nn full causal", dpa(False), causal_flops, False),
             ("two compares window", compares, win_flops, False)]
    # the forwards first, then the gradients (each row printed as it is measured)
    for name, label, f, flops, others in [("forward",) + c for c in cases] + \
            [("value_and_grad",) + c for c in cases]:
        fn, args, fl = (f, (q, k, v), flops) if name == "forward" else \
            (vg(f), (q, k, v, do), 3.5 * flops)
        jf = runtime.jit(fn, backend="cuda")
        c = jf.lower(*args).compile()
        fused = [i for i in c.module.entry.instructions if i.opcode == "fusion"
                 and fusion_kind(i) in ("attention", "attention_backward")]
        preds = sum(1 for i in fused for o in i.operands if o.shape.dtype.name == "pred")
        xla = jax.jit(fn)
        err = max(float(jnp.linalg.norm(a.astype(jnp.float32) - b.astype(jnp.float32)) /
                        jnp.linalg.norm(b.astype(jnp.float32)))
                  for a, b in zip(jax.tree_util.tree_leaves(jf(*args)),
                                  jax.tree_util.tree_leaves(xla(*args))))
        print(f"{label} {name}: attention fusions {len(fused)}, mask operands {preds}, "
              f"relative error vs jax.jit {err:.3g}", flush=True)
        timed = [("hlotk", lambda: jf(*args))]
        if others:
            timed.append(("jax.jit XLA", lambda: xla(*args)))
            try:
                cf = dpa(True, "cudnn")
                cud = jax.jit(cf if name == "forward" else vg(cf))
                jax.block_until_ready(cud(*args))
                timed.append(("jax.jit cuDNN", lambda: cud(*args)))
            except Exception as e:  # noqa: BLE001  (not in every jaxlib / cuDNN)
                print(f"  cudnn unavailable: {type(e).__name__}: {str(e)[:160]}")
        for who, call in timed:
            ms = pipelined_ms(call, n=20, rounds=5)
            rows.append((f"{label} {name}: {who}, pipelined", ms, fl / (ms * 1e-3) / 1e12))
            print(f"  {rows[-1][0]}: {ms:.3f} ms, {rows[-1][2]:.4g} TFLOP/s", flush=True)
    print_rows(rows)


def gqa_forms_section() -> None:
    """``--only gqa_forms``: grouped-query attention written as a grouped einsum, the
    scores kv-major [b, kv, g, q, k] or group-major [b, g, kv, q, k] (batch dims between
    row dims: the kernels read it through a permutation), causal, f32 softmax, bf16
    B2 H32 KV8 S4096 D128: forward and value_and_grad, hlotk vs jax.jit, pipelined ms."""
    import jax
    import jax.numpy as jnp

    import runtime
    from passes.fusion import fusion_kind
    b, s, h, kv, d = 2, 4096, 32, 8, 128
    g = h // kv
    ks = jax.random.split(jax.random.PRNGKey(3), 4)
    q = jax.random.normal(ks[0], (b, s, h, d), jnp.bfloat16)
    k, v, do = (jax.random.normal(kk, sh, jnp.bfloat16) for kk, sh in
                ((ks[1], (b, s, kv, d)), (ks[2], (b, s, kv, d)), (ks[3], (b, s, h, d))))
    flops = 4 * b * h * s * s * d / 2
    rows = []
    for order in ("bkgqs", "bgkqs"):
        def attn(q, k, v, order=order):
            sc = jnp.einsum(f"bqkgd,bskd->{order}", q.reshape(b, s, kv, g, d), k)
            sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), sc.astype(jnp.float32) / d ** 0.5,
                           -1e30)
            p = jax.nn.softmax(sc, axis=-1).astype(v.dtype)
            return jnp.einsum(f"{order},bskd->bqkgd", p, v).reshape(b, s, h, d)
        vg = jax.value_and_grad(lambda q, k, v, do, attn=attn: jnp.sum(
            attn(q, k, v).astype(jnp.float32) * do.astype(jnp.float32)), argnums=(0, 1, 2))
        for name, fn, args, fl in (("forward", attn, (q, k, v), flops),
                                   ("value_and_grad", vg, (q, k, v, do), 3.5 * flops)):
            jf = runtime.jit(fn, backend="cuda")
            kinds = [fusion_kind(i) for i in jf.lower(*args).compile().module.entry.instructions
                     if i.opcode == "fusion"]
            print(f"grouped einsum {order} {name}: attention fusions "
                  f"{kinds.count('attention')} / {kinds.count('attention_backward')}", flush=True)
            xla = jax.jit(fn)
            for who, call in (("hlotk", lambda: jf(*args)), ("jax.jit", lambda: xla(*args))):
                ms = pipelined_ms(call)
                rows.append((f"einsum GQA {order} {name}: {who}, pipelined", ms,
                             fl / (ms * 1e-3) / 1e12))
    print_rows(rows)


def kernel_section(opts) -> dict:
    """Per-kernel breakdown of the training step: hlotk (and the baseline pipeline) and
    XLA, same process (benchmarks/kernel_profile.py); printed, returned for --out."""
    import os
    from benchmarks.kernel_profile import format_table, kernel_table
    fn, args = train_program()
    dump = os.environ.get("OUT", "")
    res: dict = {}
    try:
        res.update(kernel_table(fn, args, xla=True, dump_dir=dump))
        if opts.baseline:
            res.update(kernel_table(fn, args, pipeline=baseline_spec(opts.baseline), xla=False,
                                    dump_dir=dump, tag="baseline"))
    except Exception:  # noqa: BLE001  (the suite's numbers above still stand)
        import traceback
        traceback.print_exc()
    print("=== per-kernel device time, transformer training step (us per step) ===")
    print(format_table(res), flush=True)
    return res


def kernel_and_xent(only: set) -> None:
    import jax
    import jax.numpy as jnp
    import torch
    import runtime
    from benchmarks.gpu_suite import bench, wall_ms
    from codegen.triton.attention import flash_attention
    from passes.fusion import fusion_kind
    rows = []
    key = jax.random.PRNGKey(0)
    if "kernel" in only:      # the flash kernel alone, SDPA
        b, h, s, d = 2, 16, 4096, 128
        q, k, v = (jax.random.normal(kk, (b, s, h, d), jnp.bfloat16) for kk in jax.random.split(key, 3))
        flops = 4 * b * h * s * s * d / 2
        jf = runtime.jit(causal_attention, backend="cuda")
        comp = jf.lower(q, k, v).compile()
        fa = [i for i in comp.module.entry.instructions
              if i.opcode == "fusion" and fusion_kind(i) == "attention"]
        print("attention fusions:", len(fa), "temp MiB:",
              comp.memory_analysis().temp_size_in_bytes / 2**20, flush=True)
        want = jax.jit(causal_attention)(q, k, v)
        got = jf(q, k, v)
        err = float(jnp.max(jnp.abs(jnp.asarray(got, jnp.float32) - want.astype(jnp.float32))))
        print("max abs err vs jax.jit:", err, flush=True)
        tq, tk, tv = (torch.from_dlpack(x) for x in (q, k, v))
        out = torch.empty(tuple(fa[0].shape.dims), dtype=tq.dtype, device=tq.device)
        flash_attention(fa[0], [tq, tk, tv], out)       # autotunes once for this shape
        from codegen.triton.attention import _TUNED
        print("tuned flash configs (BM, BN, warps, stages):", list(_TUNED.values()), flush=True)
        ms_kernel = bench(lambda: flash_attention(fa[0], [tq, tk, tv], out))
        xla = jax.jit(causal_attention)
        tq2, tk2, tv2 = (t.transpose(1, 2) for t in (tq, tk, tv))

        def sdpa():
            return torch.nn.functional.scaled_dot_product_attention(tq2, tk2, tv2,
                                                                    is_causal=True)
        timed = [("hlotk flash kernel alone (do_bench)", ms_kernel),
                 ("hlotk runtime.jit cuda, pipelined", pipelined_ms(lambda: jf(q, k, v))),
                 ("jax.jit (XLA), pipelined", pipelined_ms(lambda: xla(q, k, v))),
                 ("hlotk runtime.jit cuda, blocked (wall)",
                  wall_ms(lambda: jax.block_until_ready(jf(q, k, v)))),
                 ("jax.jit (XLA), blocked (wall)",
                  wall_ms(lambda: jax.block_until_ready(xla(q, k, v)))),
                 ("torch SDPA (do_bench)", bench(sdpa)),
                 ("torch SDPA, pipelined", pipelined_ms(sdpa, torch_sync=True))]
        for name, ms in timed:
            rows.append((f"causal attn B2 H16 S4096 D128 bf16: {name}", ms,
                         flops / (ms * 1e-3) / 1e12))
    # Cross-entropy, 32k vocabulary: gathers computed at the label (passes/gather_sinking.py).
    if "xent" not in only:
        return print_rows(rows)
    x16 = jax.random.normal(key, (8192, 32000), jnp.bfloat16)
    labels = jax.random.randint(key, (8192,), 0, 32000)
    masked = labels.at[::7].set(-100)
    for name, fn, x, lab in [("xent nll bf16", cross_entropy, x16, labels),
                             ("xent nll f32", cross_entropy, x16.astype(jnp.float32), labels),
                             ("xent masked mean bf16", masked_mean_nll, x16, masked)]:
        jce = runtime.jit(fn, backend="cuda")
        xce = jax.jit(fn)
        temp = jce.lower(x, lab).compile().memory_analysis().temp_size_in_bytes
        err = float(jnp.max(jnp.abs(jnp.asarray(jce(x, lab)) - xce(x, lab))))
        ms_h = bench(lambda: jax.block_until_ready(jce(x, lab)))
        ms_x = bench(lambda: xce(x, lab).block_until_ready())
        rows.append((f"{name} 8192x32000: hlotk (temp {temp / 2**20:.3f} MiB)", ms_h, err))
        rows.append((f"{name} 8192x32000: jax.jit", ms_x, ms_h / ms_x))
        # do_bench's events can miss work the runtime launches on its own stream (a
        # single-thunk program measured above HBM bandwidth, NOTES stage 3): host wall
        # time from an idle GPU with a flushed L2 as well, for both.
        w_h = wall_ms(lambda: jax.block_until_ready(jce(x, lab)))
        w_x = wall_ms(lambda: jax.block_until_ready(xce(x, lab)))
        rows.append((f"{name} 8192x32000: hlotk wall", w_h, err))
        rows.append((f"{name} 8192x32000: jax.jit wall", w_x, w_h / w_x))
    print_rows(rows)


def dpa_section(grad: bool = True) -> None:
    """``jax.nn.dot_product_attention`` as users call it (``--only dpa``): hlotk compiling
    its XLA implementation vs jax.jit of the same and of cuDNN's, pipelined per-call ms,
    causal bf16 at the issue's MHA shape and a Llama-style GQA shape (32 q heads, 8 kv)."""
    import jax
    import jax.numpy as jnp

    import runtime
    from passes.fusion import fusion_kind
    rows = []
    key = jax.random.PRNGKey(1)
    for label, (b, s, h, kv, d) in [("MHA B2 H16 S4096 D128", (2, 4096, 16, 16, 128)),
                                     ("GQA B2 H32 KV8 S4096 D128", (2, 4096, 32, 8, 128))]:
        kq, kk, kvk = jax.random.split(key, 3)
        q = jax.random.normal(kq, (b, s, h, d), jnp.bfloat16)
        k = jax.random.normal(kk, (b, s, kv, d), jnp.bfloat16)
        v = jax.random.normal(kvk, (b, s, kv, d), jnp.bfloat16)
        flops = 4 * b * h * s * s * d / 2

        def attn(q, k, v, impl="xla"):
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
        jf = runtime.jit(attn, backend="cuda")
        fused = [i for i in jf.lower(q, k, v).compile().module.entry.instructions
                 if i.opcode == "fusion" and fusion_kind(i) == "attention"]
        xla = jax.jit(attn)
        want = xla(q, k, v).astype(jnp.float32)
        err = float(jnp.max(jnp.abs(jf(q, k, v).astype(jnp.float32) - want)))
        print(f"jax.nn {label}: attention fusions {len(fused)}, max abs err vs jax.jit {err:.3g}",
              flush=True)
        timed = [("hlotk (xla implementation), pipelined", lambda: jf(q, k, v)),
                 ("jax.jit, implementation='xla', pipelined", lambda: xla(q, k, v))]
        try:
            cud = jax.jit(lambda q, k, v: attn(q, k, v, "cudnn"))
            cud(q, k, v).block_until_ready()
            timed.append(("jax.jit, implementation='cudnn', pipelined", lambda: cud(q, k, v)))
        except Exception as e:  # noqa: BLE001  (cuDNN's attention is not in every jaxlib)
            print(f"  cudnn implementation unavailable: {type(e).__name__}: {str(e)[:120]}")
        for name, call in timed:
            ms = pipelined_ms(call)
            rows.append((f"jax.nn.dpa {label}: {name}", ms, flops / (ms * 1e-3) / 1e12))
        if kv != h and grad:
            rows += _dpa_grad_rows(label, attn, (q, k, v), flops)
    print_rows(rows)


def _dpa_grad_rows(label: str, attn, args: tuple, fwd_flops: float) -> list:
    """jax.value_and_grad (w.r.t. q, k, v) of sum(o * dO) for ``attn``, as a training step
    takes it (the loss needs o, so the forward runs too; a bare jax.grad of this linear
    loss has no forward P·V at all, which the matcher does not take): hlotk vs jax.jit of
    the XLA and cuDNN implementations, pipelined per-call ms; TFLOP/s counts the forward
    plus the usual 2.5x for the backward (recomputing P is not counted)."""
    import jax
    import jax.numpy as jnp

    import runtime
    from passes.fusion import fusion_kind
    q = args[0]
    do = jax.random.normal(jax.random.PRNGKey(7), q.shape, jnp.bfloat16)

    def grad_of(impl):
        return jax.value_and_grad(lambda q, k, v, do: jnp.sum(
            attn(q, k, v, impl).astype(jnp.float32) * do.astype(jnp.float32)),
            argnums=(0, 1, 2))
    jf = runtime.jit(grad_of("xla"), backend="cuda")
    kinds = [fusion_kind(i) for i in jf.lower(*args, do).compile().module.entry.instructions
             if i.opcode == "fusion"]
    xla = jax.jit(grad_of("xla"))
    got, want = jf(*args, do)[1], xla(*args, do)[1]
    err = max(float(jnp.linalg.norm(a.astype(jnp.float32) - b.astype(jnp.float32)) /
                    jnp.linalg.norm(b.astype(jnp.float32))) for a, b in zip(got, want))
    print(f"jax.nn {label} grad: attention fusions {kinds.count('attention')} forward, "
          f"{kinds.count('attention_backward')} backward, relative error vs jax.jit {err:.3g}",
          flush=True)
    timed = [("grad, hlotk (xla implementation), pipelined", lambda: jf(*args, do)),
             ("grad, jax.jit, implementation='xla', pipelined", lambda: xla(*args, do))]
    try:
        cud = jax.jit(grad_of("cudnn"))
        jax.block_until_ready(cud(*args, do))
        timed.append(("grad, jax.jit, implementation='cudnn', pipelined",
                      lambda: cud(*args, do)))
    except Exception as e:  # noqa: BLE001  (cuDNN's attention is not in every jaxlib)
        print(f"  cudnn gradient unavailable: {type(e).__name__}: {str(e)[:120]}")
    flops = 3.5 * fwd_flops
    return [(f"jax.nn.dpa {label}: {name}", ms, flops / (ms * 1e-3) / 1e12)
            for name, ms in ((n, pipelined_ms(c)) for n, c in timed)]


def pipelined_ms(call, n: int = 50, rounds: int = 7, torch_sync: bool = False) -> float:
    """Per-call ms of ``n`` calls issued back to back with one wait at the end (for the
    last call's result, or torch.cuda.synchronize for a torch call), median over
    ``rounds``: the steady state of a loop that does not wait for each result."""
    import statistics
    import time

    import jax

    def wait(r):
        if torch_sync:
            import torch
            torch.cuda.synchronize()
        else:
            jax.block_until_ready(r)
    for _ in range(3):                  # compile, autotune, warm caches
        wait(call())
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            r = call()
        wait(r)
        times.append((time.perf_counter() - t0) * 1e3 / n)
    return statistics.median(times)


def print_rows(rows: list) -> None:
    print(f"{'case':62s} {'ms':>8s}  TFLOP/s|err|ratio")
    for name, ms, extra in rows:
        print(f"{name:62s} {ms:8.3f}  {extra:.4g}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

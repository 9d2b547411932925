"""Plain JAX attention through hlotk's flash-attention fusion vs jax.jit, same run, H200.

``python -m benchmarks.attention`` prints a table (median ms, triton.testing.do_bench):
the issue's causal attention B2 H16 S4096 D128 bf16 (einsum, where-mask, f32 softmax,
einsum) as hlotk's Triton kernel alone, as ``runtime.jit(backend="cuda")`` end to end,
as ``jax.jit`` and as torch SDPA; plus the 32k-vocabulary cross-entropy (hlotk vs XLA).
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


def main() -> None:
    import jax
    import jax.numpy as jnp
    import torch
    import runtime
    from benchmarks.gpu_suite import bench
    from codegen.triton.attention import flash_attention
    from passes.fusion import fusion_kind
    rows = []
    b, h, s, d = 2, 16, 4096, 128
    key = jax.random.PRNGKey(0)
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
    ms_hlotk = bench(lambda: jf(q, k, v))
    xla = jax.jit(causal_attention)
    ms_xla = bench(lambda: xla(q, k, v).block_until_ready())
    tq2, tk2, tv2 = (t.transpose(1, 2) for t in (tq, tk, tv))
    ms_sdpa = bench(lambda: torch.nn.functional.scaled_dot_product_attention(
        tq2, tk2, tv2, is_causal=True))
    for name, ms in [("hlotk flash kernel", ms_kernel), ("hlotk runtime.jit cuda", ms_hlotk),
                     ("jax.jit (XLA)", ms_xla), ("torch SDPA", ms_sdpa)]:
        rows.append((f"causal attn B2 H16 S4096 D128 bf16: {name}", ms,
                     flops / (ms * 1e-3) / 1e12))
    # Cross-entropy, 32k vocabulary: gathers computed at the label (passes/gather_sinking.py).
    x16 = jax.random.normal(key, (8192, 32000), jnp.bfloat16)
    labels = jax.random.randint(key, (8192,), 0, 32000)
    masked = labels.at[::7].set(-100)
    xce_nll = jax.jit(cross_entropy)
    for name, fn, x, lab in [("xent nll bf16", cross_entropy, x16, labels),
                             ("xent nll f32", cross_entropy, x16.astype(jnp.float32), labels),
                             ("xent masked mean bf16", masked_mean_nll, x16, masked)]:
        jce = runtime.jit(fn, backend="cuda")
        xce = jax.jit(fn)
        temp = jce.lower(x, lab).compile().memory_analysis().temp_size_in_bytes
        err = float(jnp.max(jnp.abs(jnp.asarray(jce(x, lab)) - xce(x, lab))))
        ms_h = bench(lambda: jce(x, lab))
        ms_x = bench(lambda: xce(x, lab).block_until_ready())
        rows.append((f"{name} 8192x32000: hlotk (temp {temp / 2**20:.3f} MiB)", ms_h, err))
        rows.append((f"{name} 8192x32000: jax.jit", ms_x, ms_h / ms_x))
    # Backward: jax.grad of the causal attention. hlotk's backward fusion runs on the host
    # (blocked numpy reference, no GPU kernel yet), so it is timed once on a small shape;
    # jax.jit on both shapes.
    def grad_of(shape):
        ks = jax.random.split(jax.random.PRNGKey(1), 3)
        args = [jax.random.normal(kk, shape, jnp.bfloat16) for kk in ks]
        g = jax.grad(lambda q, k, v: jnp.sum(causal_attention(q, k, v).astype(jnp.float32)
                                             ** 2), argnums=(0, 1, 2))
        return g, args
    import time
    for shape in ((1, 1024, 4, 64), (b, s, h, d)):
        g, args = grad_of(shape)
        xg = jax.jit(g)
        ms_x = bench(lambda: jax.block_until_ready(xg(*args)))
        rows.append((f"grad causal {shape}: jax.jit", ms_x, 0.0))
        if shape[1] <= 1024:
            jg = runtime.jit(g, backend="cuda")
            c = jg.lower(*args).compile()
            kinds = [fusion_kind(i) for i in c.module.entry.instructions if i.opcode == "fusion"]
            got = jg(*args)
            t0 = time.perf_counter()
            got = jg(*args)
            wall = (time.perf_counter() - t0) * 1e3
            err = max(float(jnp.max(jnp.abs(jnp.asarray(a, jnp.float32) -
                                            jnp.asarray(w, jnp.float32))))
                      for a, w in zip(got, xg(*args)))
            rows.append((f"grad causal {shape}: hlotk wall (host bwd; "
                         f"{kinds.count('attention_backward')} bwd fusion, temp "
                         f"{c.memory_analysis().temp_size_in_bytes / 2**20:.1f} MiB)", wall, err))
    print(f"{'case':62s} {'ms':>8s}  TFLOP/s|err|ratio")
    for name, ms, extra in rows:
        print(f"{name:62s} {ms:8.3f}  {extra:.4g}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

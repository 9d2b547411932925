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
    ms_kernel = bench(lambda: flash_attention(fa[0], [tq, tk, tv]))
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
    # Cross-entropy, 32k vocabulary (stage 2 of issue 14 not done: baseline numbers).
    x = jax.random.normal(key, (8192, 32000), jnp.bfloat16)
    labels = jax.random.randint(key, (8192,), 0, 32000)
    jce = runtime.jit(cross_entropy, backend="cuda")
    xce = jax.jit(cross_entropy)
    err = float(jnp.max(jnp.abs(jnp.asarray(jce(x, labels)) - xce(x, labels))))
    rows.append(("xent 8192x32000 bf16: hlotk", bench(lambda: jce(x, labels)), err))
    rows.append(("xent 8192x32000 bf16: jax.jit", bench(lambda: xce(x, labels).block_until_ready()),
                 0.0))
    print(f"{'case':62s} {'ms':>8s}  TFLOP/s|err")
    for name, ms, extra in rows:
        print(f"{name:62s} {ms:8.3f}  {extra:.4g}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Programs people compile that are not in the GPU suite (issue 13's compile-time work is
measured on them too, so a speed-up is not tuned to the suite): in gpu_suite's tuple format
(name, label, fn, args, min bytes, flops, flop kind, tolerance), looked up by name by
``benchmarks.compile_time --only``.

- ``adamw_200`` / ``lion_200``: an AdamW / Lion optimizer step (optax's arithmetic) over
  200 arrays of mixed sizes (a 12-layer model's weights, biases and norms, plus embeddings);
- ``transformer_train_s``: benchmarks/attention.py's transformer training step at a
  smaller batch (the graph is the suite's ``transformer_train``'s);
- ``dpa_grad``: ``jax.value_and_grad`` of a loss over ``jax.nn.dot_product_attention``
  (causal, bf16), with respect to q, k and v;
- ``xent_32k``: a language model's output layer and cross-entropy over a 32k vocabulary
  (bf16 logits GEMM, f32 log-softmax, the labels' gather), value and gradient;
- ``rmsnorm_swiglu``: a bf16 RMSNorm + SwiGLU MLP block with its residual (a LLaMA-style
  layer's second half): reductions, elementwise and three GEMMs;
- ``lion_step``: the Lion step over 60 arrays (6 blocks of 10, 256-1536 wide).
"""
from __future__ import annotations

import numpy as np

NAMES = ("adamw_200", "lion_200", "transformer_train_s", "dpa_grad", "xent_32k",
         "rmsnorm_swiglu", "lion_step")


def param_shapes() -> dict[str, tuple[int, ...]]:
    """200 arrays: 12 layers of 16 (4 attention and 2 MLP matrices, their biases, two layer
    norms' scales and offsets), token and position embeddings, the final norm, the head's
    bias and two small extras; 64 to 2.1 M elements each."""
    d, f = 384, 1536
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(12):
        shapes.update({f"l{i}.wq": (d, d), f"l{i}.wk": (d, d), f"l{i}.wv": (d, d),
                       f"l{i}.wo": (d, d), f"l{i}.bq": (d,), f"l{i}.bk": (d,),
                       f"l{i}.bv": (d,), f"l{i}.bo": (d,), f"l{i}.w1": (d, f),
                       f"l{i}.b1": (f,), f"l{i}.w2": (f, d), f"l{i}.b2": (d,),
                       f"l{i}.ln1_g": (d,), f"l{i}.ln1_b": (d,), f"l{i}.ln2_g": (d,),
                       f"l{i}.ln2_b": (d,)})
    shapes.update({"tok": (5504, d), "pos": (1024, d), "lnf_g": (d,), "lnf_b": (d,),
                   "head_b": (5504,), "scale": (64,), "temp": (1,), "gate": (d, 8)})
    assert len(shapes) == 200
    return shapes


def adamw_step(params, grads, m, v, step):
    """optax.adamw's arithmetic: Adam moments, bias correction, decoupled weight decay."""
    import jax
    import jax.numpy as jnp
    b1, b2, lr, eps, wd = 0.9, 0.999, 1e-3, 1e-8, 1e-2
    step = step + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
    c1, c2 = 1 - b1 ** step, 1 - b2 ** step
    params = jax.tree.map(lambda p, m, v: p - lr * ((m / c1) / (jnp.sqrt(v / c2) + eps) + wd * p),
                          params, m, v)
    return params, m, v, step


def lion_step(params, grads, m):
    """optax.lion's arithmetic: the sign of an interpolated momentum, decoupled decay."""
    import jax
    import jax.numpy as jnp
    b1, b2, lr, wd = 0.9, 0.99, 1e-4, 1e-2
    params = jax.tree.map(lambda p, m, g: p - lr * (jnp.sign(b1 * m + (1 - b1) * g) + wd * p),
                          params, m, grads)
    m = jax.tree.map(lambda m, g: b2 * m + (1 - b2) * g, m, grads)
    return params, m


def dpa_grad(q, k, v):
    import jax
    import jax.numpy as jnp

    def loss(q, k, v):
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return jnp.sum(jnp.square(o.astype(jnp.float32)))
    return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)


def xent_32k(h, w, labels):
    import jax
    import jax.numpy as jnp

    def loss(h, w):
        logits = (h @ w).astype(jnp.float32)
        lp = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(lp, labels[:, None], axis=-1)[:, 0]
        return -jnp.mean(picked)
    return jax.value_and_grad(loss, argnums=(0, 1))(h, w)


def rmsnorm_swiglu(w_norm, w_gate, w_up, w_down, x):
    import jax
    import jax.numpy as jnp
    xf = x.astype(jnp.float32)
    h = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6)
    h = (h * w_norm.astype(jnp.float32)).astype(x.dtype)
    gate = h @ w_gate
    up = h @ w_up
    act = (jax.nn.silu(gate.astype(jnp.float32)) * up.astype(jnp.float32)).astype(x.dtype)
    return x + act @ w_down


def llama_block(x, w_norm1, wq, wk, wv, wo, w_norm2, w_gate, w_up, w_down, *, heads=16,
                kv_heads=4):
    """A decoder block as LLaMA-style models write it: RMSNorm, grouped-query causal
    attention written plainly (K/V heads repeated, f32 softmax), residual, RMSNorm,
    SwiGLU, residual."""
    import jax
    import jax.numpy as jnp
    b, s, d = x.shape
    dh = d // heads

    def rms(y, w):
        yf = y.astype(jnp.float32)
        yf = yf * jax.lax.rsqrt(jnp.mean(yf * yf, axis=-1, keepdims=True) + 1e-6)
        return (yf * w.astype(jnp.float32)).astype(y.dtype)
    h = rms(x, w_norm1)
    q = (h @ wq).reshape(b, s, heads, dh)
    k = jnp.repeat((h @ wk).reshape(b, s, kv_heads, dh), heads // kv_heads, axis=2)
    v = jnp.repeat((h @ wv).reshape(b, s, kv_heads, dh), heads // kv_heads, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * dh ** -0.5
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    p = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1).astype(x.dtype)
    x = x + jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, s, d) @ wo
    h = rms(x, w_norm2)
    act = (jax.nn.silu((h @ w_gate).astype(jnp.float32)) *
           (h @ w_up).astype(jnp.float32)).astype(x.dtype)
    return x + act @ w_down


def llama_args(r: np.random.Generator, b: int, s: int, d: int, ffn: int,
               heads: int = 16, kv_heads: int = 4) -> tuple:
    import ml_dtypes

    def w(*shape, scale):
        return (r.standard_normal(shape) * scale).astype(ml_dtypes.bfloat16)
    kv = d // heads * kv_heads
    return (w(b, s, d, scale=1.0), w(d, scale=1.0) + 1, w(d, d, scale=d ** -0.5),
            w(d, kv, scale=d ** -0.5), w(d, kv, scale=d ** -0.5), w(d, d, scale=d ** -0.5),
            w(d, scale=1.0) + 1, w(d, ffn, scale=d ** -0.5), w(d, ffn, scale=d ** -0.5),
            w(ffn, d, scale=ffn ** -0.5))


def lion_shapes() -> dict[str, tuple[int, ...]]:
    """60 arrays: 6 blocks of 10 (matrices 256-1536 wide, biases, norms)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for b in range(6):
        d = 256 * (b + 1)
        shapes.update({f"b{b}.q": (d, d), f"b{b}.k": (d, d), f"b{b}.v": (d, d),
                       f"b{b}.o": (d, d), f"b{b}.up": (d, 2 * d), f"b{b}.down": (2 * d, d),
                       f"b{b}.up_b": (2 * d,), f"b{b}.down_b": (d,), f"b{b}.ln1": (d,),
                       f"b{b}.ln2": (d,)})
    return shapes


def programs() -> list[tuple]:
    import ml_dtypes

    from benchmarks.attention import transformer_train_args, transformer_train_step
    r = np.random.default_rng(0)

    def f32(*s, scale=1.0):
        return (r.standard_normal(s) * scale).astype(np.float32)

    def b16(*s, scale=1.0):
        return f32(*s, scale=scale).astype(ml_dtypes.bfloat16)
    shapes = param_shapes()
    tree = lambda scale: {k: f32(*s, scale=scale) for k, s in shapes.items()}  # noqa: E731
    params, grads, m = tree(0.02), tree(1e-3), tree(1e-4)
    v = {k: np.abs(a) for k, a in tree(1e-6).items()}
    elems = sum(int(np.prod(s)) for s in shapes.values())
    b, s, h, d = 2, 1024, 8, 64
    qkv = tuple(b16(b, s, h, d) for _ in range(3))
    tokens, dm, vocab = 2048, 512, 32000
    t, dn, f = 4096, 2048, 5632
    mlp_args = (b16(dn), b16(dn, f, scale=dn ** -0.5), b16(dn, f, scale=dn ** -0.5),
                b16(f, dn, scale=f ** -0.5), b16(t, dn))
    small = lion_shapes()
    lion_args = tuple({k: f32(*sh) for k, sh in small.items()} for _ in range(3))
    small_elems = sum(int(np.prod(sh)) for sh in small.values())
    return [
        ("adamw_200", f"AdamW step f32, 200 arrays ({elems / 1e6:.1f}M)", adamw_step,
         (params, grads, m, v, np.float32(10.0)), 7 * 4 * elems, 0, "", 1e-5),
        ("lion_200", f"Lion step f32, 200 arrays ({elems / 1e6:.1f}M)", lion_step,
         (params, grads, m), 5 * 4 * elems, 0, "", 1e-5),
        ("transformer_train_s", "transformer training step B2 S512 D512 H8 (the suite's "
         "transformer_train's graph)", transformer_train_step(8),
         transformer_train_args(2, 512, 512), 0, 0, "bf16", 3e-2),
        ("dpa_grad", f"value_and_grad of jax.nn.dot_product_attention (causal) B{b} S{s} "
         f"H{h} D{d} bf16", dpa_grad, qkv, 0, 0, "bf16", 3e-2),
        ("xent_32k", f"output layer + cross-entropy, {tokens} tokens, D{dm}, vocab {vocab}, "
         "value and grad", xent_32k,
         (b16(tokens, dm), b16(dm, vocab, scale=dm ** -0.5),
          r.integers(0, vocab, (tokens,)).astype(np.int32)), 0, 0, "bf16", 3e-2),
        ("rmsnorm_swiglu", f"RMSNorm + SwiGLU MLP + residual bf16 x[{t},{dn}] ffn {f}",
         rmsnorm_swiglu, mlp_args, 2 * (2 * t * dn + 3 * dn * f), 2 * 3 * t * dn * f, "bf16",
         3e-2),
        ("llama_block", "decoder block bf16 B2 S2048 D2048, 16 q / 4 kv heads (plain GQA "
         "causal attention), RMSNorm, SwiGLU 5632", llama_block,
         llama_args(r, 2, 2048, 2048, 5632), 0,
         2 * 2 * 2048 * (2048 * 2048 * 2 + 2048 * 512 * 2 + 3 * 2048 * 5632)
         + 2 * 2 * 16 * 2048 * 2048 * 128, "bf16", 3e-2),
        ("lion_step", f"Lion step f32, {len(small)} params ({small_elems / 1e6:.1f}M)",
         lion_step, lion_args, 5 * 4 * small_elems, 0, "", 1e-5),
    ]

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
- ``lion_step``: the Lion step over 60 arrays (6 blocks of 10, 256-1536 wide);
- ``gpt_train_step``: a whole training step of a small GPT written as people write one in
  JAX: token embedding (a gather) and learned positions, pre-LayerNorm blocks with plain
  causal multi-head attention (f32 softmax) and a GELU MLP, a tied output layer, the mean
  cross-entropy over the tokens, ``jax.value_and_grad``, then AdamW over every parameter.
  f32 parameters, bf16 activations (mixed precision);
- ``kv_decode``: one decoding step with a KV cache: the new key and value written into the
  cache at a position (dynamic_update_slice), attention of one query over the cache up to
  it, the output projection;
- ``moe_grad``: a mixture-of-experts layer with top-2 routing (top_k) and dense one-hot
  dispatch einsums (GShard style), value_and_grad over the experts' weights;
- ``conv_bn_grad``: a ResNet basic block (3x3 convolutions, batch norm, ReLU, residual) in
  NHWC, value_and_grad over its weights and norms;
- ``lstm_grad``: an LSTM over a sequence with ``lax.scan`` (a while loop), value_and_grad.
"""
from __future__ import annotations

import functools

import numpy as np

NAMES = ("adamw_200", "lion_200", "transformer_train_s", "dpa_grad", "xent_32k",
         "rmsnorm_swiglu", "lion_step", "gpt_train_step", "kv_decode", "moe_grad",
         "conv_bn_grad", "lstm_grad")


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


def gpt_loss(params: dict, tokens, *, heads: int, act_dtype=None):
    """The mean next-token cross-entropy of a small GPT (``gpt_train_step``'s model):
    ``tokens`` int32 [B, S+1], the first S the input, the last S the labels. Activations
    in ``act_dtype`` (default bf16; f32 gives a reference for the bf16 program's error)."""
    import jax
    import jax.numpy as jnp
    bf16 = act_dtype or jnp.bfloat16
    inp, labels = tokens[:, :-1], tokens[:, 1:]
    b, s = inp.shape
    d = params["tok"].shape[1]
    dh = d // heads

    def ln(y, g, o):
        yf = y.astype(jnp.float32)
        mu = jnp.mean(yf, -1, keepdims=True)
        var = jnp.mean(jnp.square(yf - mu), -1, keepdims=True)
        return ((yf - mu) * jax.lax.rsqrt(var + 1e-5) * g + o).astype(bf16)
    x = (params["tok"][inp] + params["pos"][:s]).astype(bf16)
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    layers = sorted({k.split(".")[0] for k in params if "." in k}, key=lambda n: int(n[1:]))
    for name in layers:
        p = {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith(name + ".")}
        h = ln(x, p["ln1_g"], p["ln1_b"])
        qkv = h @ p["wqkv"].astype(bf16) + p["bqkv"].astype(bf16)
        q, k, v = (t.reshape(b, s, heads, dh) for t in jnp.split(qkv, 3, axis=-1))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * dh ** -0.5
        att = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1).astype(bf16)
        o = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, d)
        x = x + o @ p["wo"].astype(bf16) + p["bo"].astype(bf16)
        h = ln(x, p["ln2_g"], p["ln2_b"])
        h = jax.nn.gelu(h @ p["w1"].astype(bf16) + p["b1"].astype(bf16))
        x = x + h @ p["w2"].astype(bf16) + p["b2"].astype(bf16)
    h = ln(x, params["lnf_g"], params["lnf_b"])
    logits = (h @ params["tok"].astype(bf16).T).astype(jnp.float32)
    lp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(lp, labels[..., None], axis=-1))


def gpt_train_step(params: dict, m: dict, v: dict, step, tokens, *, heads: int,
                   act_dtype=None):
    """One training step: loss and gradients of ``gpt_loss``, then ``adamw_step``."""
    import jax
    loss, grads = jax.value_and_grad(
        lambda p: gpt_loss(p, tokens, heads=heads, act_dtype=act_dtype))(params)
    params, m, v, step = adamw_step(params, grads, m, v, step)
    return loss, params, m, v, step


def gpt_shapes(layers: int, d: int, vocab: int, seq: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"tok": (vocab, d), "pos": (seq, d),
                                          "lnf_g": (d,), "lnf_b": (d,)}
    for i in range(layers):
        shapes.update({f"l{i}.ln1_g": (d,), f"l{i}.ln1_b": (d,), f"l{i}.wqkv": (d, 3 * d),
                       f"l{i}.bqkv": (3 * d,), f"l{i}.wo": (d, d), f"l{i}.bo": (d,),
                       f"l{i}.ln2_g": (d,), f"l{i}.ln2_b": (d,), f"l{i}.w1": (d, 4 * d),
                       f"l{i}.b1": (4 * d,), f"l{i}.w2": (4 * d, d), f"l{i}.b2": (d,)})
    return shapes


def gpt_args(r: np.random.Generator, b: int, s: int, d: int, layers: int, vocab: int
             ) -> tuple:
    """(params, m, v, step, tokens): weights N(0, 1/sqrt(fan-in)), norms' scales 1, the
    moments of a few steps in, random tokens."""
    shapes = gpt_shapes(layers, d, vocab, s)

    def init(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name.endswith("_g"):
            return np.ones(shape, np.float32)
        if len(shape) == 1:
            return np.zeros(shape, np.float32)
        return (r.standard_normal(shape) * shape[0] ** -0.5).astype(np.float32)
    params = {k: init(k, sh) for k, sh in shapes.items()}
    m = {k: (r.standard_normal(sh) * 1e-4).astype(np.float32) for k, sh in shapes.items()}
    v = {k: np.abs(r.standard_normal(sh) * 1e-6).astype(np.float32) for k, sh in shapes.items()}
    tokens = r.integers(0, vocab, (b, s + 1)).astype(np.int32)
    return params, m, v, np.float32(3.0), tokens


def kv_decode(cache_k, cache_v, x, wq, wk, wv, wo, pos):
    """One decoding step: x [B, D] at position ``pos`` of caches [B, H, S, Dh]."""
    import jax
    import jax.numpy as jnp
    b, h, smax, dh = cache_k.shape
    q, k, v = ((x @ w).reshape(b, h, 1, dh) for w in (wq, wk, wv))
    cache_k = jax.lax.dynamic_update_slice(cache_k, k, (0, 0, pos, 0))
    cache_v = jax.lax.dynamic_update_slice(cache_v, v, (0, 0, pos, 0))
    s = jnp.einsum("bhqd,bhkd->bhqk", q, cache_k).astype(jnp.float32) * dh ** -0.5
    s = jnp.where(jnp.arange(smax)[None, None, None, :] <= pos, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1).astype(x.dtype)
    o = jnp.einsum("bhqk,bhkd->bhqd", p, cache_v).reshape(b, h * dh)
    return o @ wo, cache_k, cache_v


def moe_grad(x, w_router, w1, w2):
    """value_and_grad over (w1, w2) of a top-2 mixture-of-experts layer's squared output."""
    import jax
    import jax.numpy as jnp

    def layer(w1, w2):
        gates = jax.nn.softmax((x @ w_router).astype(jnp.float32), axis=-1)
        top_v, top_i = jax.lax.top_k(gates, 2)
        top_v = top_v / jnp.sum(top_v, axis=-1, keepdims=True)
        dispatch = jax.nn.one_hot(top_i, w_router.shape[1], dtype=x.dtype)    # [T, 2, E]
        combine = (dispatch * top_v[..., None].astype(x.dtype)).sum(1)        # [T, E]
        xe = jnp.einsum("te,td->etd", dispatch.sum(1), x)
        h = jax.nn.gelu(jnp.einsum("etd,edf->etf", xe, w1))
        y = jnp.einsum("etd,te->td", jnp.einsum("etf,efd->etd", h, w2), combine)
        return jnp.sum(jnp.square(y.astype(jnp.float32)))
    return jax.value_and_grad(layer, argnums=(0, 1))(w1, w2)


def conv_bn_grad(x, w1, w2, g1, b1, g2, b2):
    """value_and_grad of a ResNet basic block's mean squared output (NHWC, batch norm with
    batch statistics)."""
    import jax
    import jax.numpy as jnp

    def bn(y, g, b):
        yf = y.astype(jnp.float32)
        m, v = jnp.mean(yf, axis=(0, 1, 2)), jnp.var(yf, axis=(0, 1, 2))
        return ((yf - m) * jax.lax.rsqrt(v + 1e-5) * g + b).astype(y.dtype)

    def block(w1, w2, g1, b1, g2, b2):
        dn = ("NHWC", "HWIO", "NHWC")
        y = jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn)
        y = jax.nn.relu(bn(y, g1, b1))
        y = jax.lax.conv_general_dilated(y, w2, (1, 1), "SAME", dimension_numbers=dn)
        y = jax.nn.relu(bn(y, g2, b2) + x)
        return jnp.mean(jnp.square(y.astype(jnp.float32)))
    return jax.value_and_grad(block, argnums=(0, 1, 2, 3, 4, 5))(w1, w2, g1, b1, g2, b2)


def lstm_grad(xs, wx, wh, b):
    """value_and_grad over the weights of an LSTM run over xs [T, B, I] by lax.scan."""
    import jax
    import jax.numpy as jnp

    def run(wx, wh, b):
        def cell(carry, x):
            h, c = carry
            i, f, g, o = jnp.split(x @ wx + h @ wh + b, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h
        zeros = jnp.zeros((xs.shape[1], wh.shape[0]), xs.dtype)
        _, hs = jax.lax.scan(cell, (zeros, zeros), xs)
        return jnp.mean(jnp.square(hs))
    return jax.value_and_grad(run, argnums=(0, 1, 2))(wx, wh, b)


def more_args(r: np.random.Generator, name: str, small: bool = False) -> tuple:
    """Arguments of kv_decode, moe_grad, conv_bn_grad and lstm_grad: realistic sizes, or
    ``small`` ones for the CPU tests."""
    import ml_dtypes
    bf = ml_dtypes.bfloat16

    def f32(*shape, scale=1.0):
        return (r.standard_normal(shape) * scale).astype(np.float32)
    if name == "kv_decode":
        b, h, smax, dh = (2, 4, 64, 16) if small else (8, 16, 2048, 128)
        d = h * dh
        return (f32(b, h, smax, dh).astype(bf), f32(b, h, smax, dh).astype(bf),
                f32(b, d).astype(bf), *(f32(d, d, scale=d ** -0.5).astype(bf) for _ in range(4)),
                np.int32(smax // 2 + 5))
    if name == "moe_grad":
        t, d, e, f = (32, 16, 4, 32) if small else (4096, 1024, 8, 4096)
        return (f32(t, d).astype(bf), f32(d, e, scale=d ** -0.5).astype(bf),
                f32(e, d, f, scale=d ** -0.5).astype(bf), f32(e, f, d, scale=f ** -0.5).astype(bf))
    if name == "conv_bn_grad":
        n, hw, c = (2, 8, 16) if small else (32, 56, 64)
        dt = np.float32 if small else bf
        return (f32(n, hw, hw, c).astype(dt), f32(3, 3, c, c, scale=(9 * c) ** -0.5).astype(dt),
                f32(3, 3, c, c, scale=(9 * c) ** -0.5).astype(dt), np.ones(c, np.float32),
                np.zeros(c, np.float32), np.ones(c, np.float32), np.zeros(c, np.float32))
    t, b, i, h = (12, 4, 8, 16) if small else (128, 64, 256, 512)
    return (f32(t, b, i), f32(i, 4 * h, scale=i ** -0.5), f32(h, 4 * h, scale=h ** -0.5),
            f32(4 * h, scale=0.1))


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
        ("gpt_train_step", "GPT training step: B4 S1024 D768 12 heads, 2 layers, vocab 32000, "
         "tied embedding, cross-entropy, AdamW (f32 params, bf16 activations)",
         functools.partial(gpt_train_step, heads=12), gpt_args(r, 4, 1024, 768, 2, 32000),
         0, 0, "bf16", 3e-2),
        ("kv_decode", "decoding step with a KV cache: B8 H16 S2048 Dh128 bf16, cache update "
         "at a position, one query's attention, projections", kv_decode,
         more_args(r, "kv_decode"), 0, 0, "bf16", 3e-2),
        ("moe_grad", "top-2 mixture of experts, 4096 tokens, D1024, 8 experts of 4096, dense "
         "one-hot dispatch, value_and_grad (bf16)", moe_grad, more_args(r, "moe_grad"), 0, 0,
         "bf16", 3e-2),
        ("conv_bn_grad", "ResNet basic block N32 56x56 C64 bf16 NHWC (conv, batch norm, ReLU, "
         "residual), value_and_grad", conv_bn_grad, more_args(r, "conv_bn_grad"), 0, 0,
         "bf16", 3e-2),
        ("lstm_grad", "LSTM by lax.scan, T128 B64 I256 H512 f32, value_and_grad", lstm_grad,
         more_args(r, "lstm_grad"), 0, 0, "", 1e-4),
    ]

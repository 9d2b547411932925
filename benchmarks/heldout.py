"""Programs outside ``gpu_suite`` for issue 13's compile-time checks (a held-out set: nothing
in the compiler was tuned on them). Same tuple layout as ``gpu_suite.programs()``:
(name, description, function, arguments, bytes, flops, kind, tolerance).

- ``rmsnorm_swiglu``: a bf16 RMSNorm + SwiGLU MLP block with its residual (a LLaMA-style
  layer's second half): reductions, elementwise and three GEMMs;
- ``lion_step``: one Lion optimizer update over 60 f32 arrays of mixed sizes.
"""
from __future__ import annotations

import numpy as np


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


def lion_step(params, grads, m):
    """optax.lion's arithmetic (b1 0.9, b2 0.99, lr 1e-4, weight decay 1e-2)."""
    import jax
    import jax.numpy as jnp
    b1, b2, lr, wd = 0.9, 0.99, 1e-4, 1e-2
    upd = jax.tree.map(lambda m, g: jnp.sign(b1 * m + (1 - b1) * g), m, grads)
    params = jax.tree.map(lambda p, u: p - lr * (u + wd * p), params, upd)
    m = jax.tree.map(lambda m, g: b2 * m + (1 - b2) * g, m, grads)
    return params, m


def lion_shapes() -> dict:
    """60 arrays: 6 blocks of 10 (matrices 256-2048 wide, biases, norms)."""
    shapes = {}
    for b in range(6):
        d = 256 * (b + 1)
        shapes.update({f"b{b}.q": (d, d), f"b{b}.k": (d, d), f"b{b}.v": (d, d),
                       f"b{b}.o": (d, d), f"b{b}.up": (d, 2 * d), f"b{b}.down": (2 * d, d),
                       f"b{b}.up_b": (2 * d,), f"b{b}.down_b": (d,), f"b{b}.ln1": (d,),
                       f"b{b}.ln2": (d,)})
    return shapes


def programs() -> list:
    import jax.numpy as jnp
    r = np.random.default_rng(13)

    def b16(*shape, scale=1.0):
        return jnp.asarray(r.standard_normal(shape, dtype=np.float32) * scale, jnp.bfloat16)

    def f32(*shape, scale=1.0):
        return (r.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)
    t, d, f = 4096, 2048, 5632
    mlp_args = (b16(d), b16(d, f, scale=d ** -0.5), b16(d, f, scale=d ** -0.5),
                b16(f, d, scale=f ** -0.5), b16(t, d))
    shapes = lion_shapes()
    lion_args = tuple({k: f32(*s) for k, s in shapes.items()} for _ in range(3))
    elems = sum(int(np.prod(s)) for s in shapes.values())
    return [
        ("rmsnorm_swiglu", f"RMSNorm + SwiGLU MLP + residual bf16 x[{t},{d}] ffn {f}",
         rmsnorm_swiglu, mlp_args, 2 * (2 * t * d + 3 * d * f), 2 * 3 * t * d * f, "bf16", 3e-2),
        ("lion_step", f"Lion step f32, {len(shapes)} params ({elems / 1e6:.1f}M) + grads, m",
         lion_step, lion_args, 5 * 4 * elems, 0, "", 1e-5),
    ]

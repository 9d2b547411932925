"""Regenerate the HLO text fixtures in this folder from JAX (CPU).

    .venv/bin/python tests/data/hlo/generate.py

For each program, writes ``<name>.lowered.hlo.txt`` (``jax.jit(f).lower(*args)
.as_text(dialect="hlo")``, the short style) and ``<name>.compiled.hlo.txt``
(``.compile().as_text()``, the long style with layouts, metadata and schedule).
"""
from __future__ import annotations

import os
import pathlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", False)
HERE = pathlib.Path(__file__).parent


def f32(*shape):
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) / 7


def programs():
    def matmul(a, b):
        return jnp.tanh(a @ b)

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (2, 2), [(1, 1), (0, 1)],
                                            rhs_dilation=(1, 1),
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def reduce(x):
        return jnp.sum(x, axis=1), jnp.max(x), jnp.argmax(x, axis=0)

    def scan(x):
        def body(c, y):
            return c * 0.5 + y, c
        return jax.lax.scan(body, jnp.zeros(x.shape[1:], x.dtype), x)

    def while_loop(n):
        return jax.lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 2.0),
                                  (0, jnp.float32(1)))

    def cond(p, x):
        return jax.lax.cond(p > 0, lambda x: jnp.sin(x), lambda x: jnp.cos(x) * 2, x)

    def switch(i, x):
        return jax.lax.switch(i, [lambda x: x + 1, lambda x: x * 3, lambda x: -x], x)

    def sort(x):
        return jnp.sort(x), jax.lax.sort((x, -x), num_keys=1)

    def gather_scatter(x, idx):
        g = x[idx]
        return g, x.at[idx].add(1.0), x.at[idx].set(g * 2)

    def rng(key):
        return jax.random.uniform(jax.random.key(key), (4, 3)), jax.random.normal(
            jax.random.key(key), (5,), dtype=jnp.bfloat16)

    def bf16(a, b):
        return jax.nn.gelu(a.astype(jnp.bfloat16) @ b.astype(jnp.bfloat16))

    def int8(a, b):
        q = jnp.clip(jnp.round(a * 10), -128, 127).astype(jnp.int8)
        r = jnp.clip(jnp.round(b * 10), -128, 127).astype(jnp.int8)
        return jax.lax.dot(q, r, preferred_element_type=jnp.int32), q >> 2, ~q

    def complex_fft(x):
        c = jnp.fft.fft(x.astype(jnp.complex64))
        return c, jnp.fft.irfft(jnp.fft.rfft(x), n=8), c * (1 + 2j), jnp.abs(c)

    def tuple_out(x):
        return x, x + 1, (x * 2, jnp.float32(3)), {"a": x.T, "b": jnp.int32(7)}, True

    def cholesky(a):
        spd = a @ a.T + 8 * jnp.eye(a.shape[0])
        l = jnp.linalg.cholesky(spd)
        return l, jax.scipy.linalg.solve_triangular(l, a, lower=True)

    def constants(x):
        c = jnp.array([[1.5, -np.inf, np.nan], [np.inf, 1e-30, 3e38]], jnp.float32)
        h = jnp.array([0.1, 65504, -0.0], jnp.float16)
        return (x + c, h * 2, jnp.array([True, False, True]) ^ (x[0] > 0),
                jnp.array([-7, 0, 7], jnp.int4).astype(jnp.int32) + 1,
                jnp.array([1, 2], jnp.uint32) * jnp.uint32(4000000000))

    def reduce_window(x):
        return (jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1),
                                      "SAME"),
                jax.grad(lambda x: jnp.sum(jax.lax.reduce_window(
                    x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 1, 1, 1), "VALID")))(x))

    def slicing(x):
        return (x[1:3, ::2], jnp.pad(x, ((1, 2), (0, 1))), jax.lax.dynamic_slice(x, (1, 1), (2, 2)),
                jnp.concatenate([x, x], 1), jnp.flip(x, 0), x.reshape(-1), jax.lax.iota(
                    jnp.int32, 5), jax.lax.reduce_precision(x, 5, 10),
                jax.lax.dynamic_update_slice(x, x[:1], (2, 0)))

    return [
        ("matmul", matmul, (f32(4, 8), f32(8, 3))),
        ("conv", conv, (f32(1, 8, 8, 3), f32(3, 3, 3, 4))),
        ("reduce", reduce, (f32(4, 6),)),
        ("scan", scan, (f32(5, 3),)),
        ("while_loop", while_loop, (np.int32(10),)),
        ("cond", cond, (np.float32(1), f32(3))),
        ("switch", switch, (np.int32(1), f32(3))),
        ("sort", sort, (f32(7)[::-1].copy(),)),
        ("gather_scatter", gather_scatter, (f32(6), np.array([1, 4, 1], np.int32))),
        ("rng", rng, (np.uint32(42),)),
        ("bf16", bf16, (f32(4, 8), f32(8, 4))),
        ("int8", int8, (f32(4, 8), f32(8, 4))),
        ("complex_fft", complex_fft, (f32(8),)),
        ("tuple_out", tuple_out, (f32(2, 3),)),
        ("cholesky", cholesky, (f32(3, 3),)),
        ("constants", constants, (f32(2, 3),)),
        ("reduce_window", reduce_window, (f32(1, 4, 4, 2),)),
        ("slicing", slicing, (f32(4, 4),)),
    ]


def main() -> None:
    for name, fn, args in programs():
        lowered = jax.jit(fn).lower(*args)
        (HERE / f"{name}.lowered.hlo.txt").write_text(lowered.as_text(dialect="hlo"))
        (HERE / f"{name}.compiled.hlo.txt").write_text(lowered.compile().as_text())
        print("wrote", name)


if __name__ == "__main__":
    main()

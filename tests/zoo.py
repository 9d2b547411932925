"""A zoo of small JAX programs that look like what real models emit.

Each entry is a ``ZooProgram``: a JAX function, a deterministic argument factory (numpy
``RandomState``), tolerances for floating-point leaves, and tags. Tests and benchmarks
import ``ZOO`` (or ``by_name``) and compare hlotk against ``jax.jit`` on the CPU.

Conventions:
* Integer and bool leaves are compared exactly; floating leaves with ``rtol``/``atol``
  (``rtol == atol == 0`` means bit-exact, used for RNG bits and exact integer-valued math).
* Tag ``"x64"``: the program needs ``jax_enable_x64``; run ``make_args``, ``jax.jit`` and
  the import inside ``jax.enable_x64(True)`` (see ``x64_scope``).
* Sizes are small: the reference interpreter runs on numpy and the zoo test must stay fast.
* Every argument is used by ``fn`` (``jax.jit`` may drop unused arguments when lowering).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

BF16 = ml_dtypes.bfloat16


@dataclass(frozen=True)
class ZooProgram:
    name: str
    fn: Callable[..., Any]
    make_args: Callable[[np.random.RandomState], tuple]
    rtol: float = 1e-5
    atol: float = 1e-5
    tags: tuple[str, ...] = field(default=())

    def args(self, seed: int = 0) -> tuple:
        """The program's arguments, the same every call for a given seed."""
        return self.make_args(np.random.RandomState(seed))


@contextlib.contextmanager
def x64_scope(prog: ZooProgram) -> Iterator[None]:
    """Enable 64-bit types while inside, only for programs tagged ``x64``."""
    if "x64" in prog.tags:
        with jax.enable_x64(True):
            yield
    else:
        yield


# --- argument helpers ---------------------------------------------------------------------
def _f32(rng: np.random.RandomState, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _bf16(rng: np.random.RandomState, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32).astype(BF16)


def _ints(rng: np.random.RandomState, lo: int, hi: int, shape: tuple, dtype=np.int32) -> np.ndarray:
    return rng.randint(lo, hi, size=shape).astype(dtype)


def _spd(rng: np.random.RandomState, n: int) -> np.ndarray:
    a = rng.standard_normal((n, n))
    return (a @ a.T + n * np.eye(n)).astype(np.float32)


ZOO: list[ZooProgram] = []


def _register(name: str, make_args: Callable[[np.random.RandomState], tuple], rtol: float = 1e-5,
              atol: float = 1e-5, tags: tuple[str, ...] = ()):
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        ZOO.append(ZooProgram(name, fn, make_args, rtol, atol, tags))
        return fn
    return deco


# --- dense networks -----------------------------------------------------------------------
def _mlp_params(rng: np.random.RandomState) -> dict:
    return {"w1": _f32(rng, 16, 32, scale=0.25), "b1": _f32(rng, 32, scale=0.1),
            "w2": _f32(rng, 32, 10, scale=0.25), "b2": _f32(rng, 10, scale=0.1)}


def _mlp_apply(p: dict, x):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    return jnp.tanh(h @ p["w2"] + p["b2"])


@_register("mlp_forward", lambda r: (_mlp_params(r), _f32(r, 8, 16)), tags=("dot", "elementwise"))
def mlp_forward(params, x):
    return _mlp_apply(params, x)


@_register("mlp_train_step", lambda r: (_mlp_params(r), _f32(r, 8, 16), _ints(r, 0, 10, (8,))),
           rtol=1e-4, atol=1e-5, tags=("grad", "dot", "reduce"))
def mlp_train_step(params, x, labels):
    def loss_fn(p):
        logits = _mlp_apply(p, x) * 3.0
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))
    loss, grads = jax.value_and_grad(loss_fn)(params)
    new = jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)
    return new, loss


# --- convolutional networks ---------------------------------------------------------------
def _batch_norm_train(x, gamma, beta, axes):
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    return (x - mean) * lax.rsqrt(var + 1e-5) * gamma + beta


@_register("cnn_nhwc", lambda r: (_f32(r, 2, 8, 8, 3), _f32(r, 3, 3, 3, 4, scale=0.3),
                                  _f32(r, 4), _f32(r, 4)),
           rtol=1e-4, atol=1e-4, tags=("conv", "reduce_window", "batch_norm"))
def cnn_nhwc(x, w, gamma, beta):
    y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = jax.nn.relu(_batch_norm_train(y, gamma, beta, axes=(0, 1, 2)))
    mx = lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    avg = lax.reduce_window(mx, 0.0, lax.add, (1, 2, 2, 1), (1, 1, 1, 1), "SAME") / 4.0
    return avg.mean(axis=(1, 2)), mx


@_register("cnn_nchw", lambda r: (_f32(r, 2, 3, 9, 9), _f32(r, 6, 3, 3, 3, scale=0.3), _f32(r, 6)),
           rtol=1e-4, atol=1e-4, tags=("conv", "reduce_window"))
def cnn_nchw(x, w, b):
    y = lax.conv_general_dilated(x, w, (2, 2), [(1, 1), (1, 1)],
                                 dimension_numbers=("NCHW", "OIHW", "NCHW"))
    y = jax.nn.relu(y + b[None, :, None, None])
    # Average pooling with padding: divide by the count of real (unpadded) elements.
    s = lax.reduce_window(y, 0.0, lax.add, (1, 1, 3, 3), (1, 1, 2, 2), [(0, 0), (0, 0), (1, 1), (1, 1)])
    n = lax.reduce_window(jnp.ones_like(y), 0.0, lax.add, (1, 1, 3, 3), (1, 1, 2, 2),
                          [(0, 0), (0, 0), (1, 1), (1, 1)])
    return s / n


@_register("conv_stride_dilation_groups", lambda r: (_f32(r, 2, 4, 11, 10), _f32(r, 6, 2, 3, 2)),
           rtol=1e-4, atol=1e-4, tags=("conv",))
def conv_stride_dilation_groups(x, w):
    # 2 feature groups, window stride (2,1), rhs (kernel) dilation (2,3), lhs dilation (1,2),
    # asymmetric padding including a negative (cropping) pad.
    return lax.conv_general_dilated(x, w, window_strides=(2, 1), padding=[(1, 2), (-1, 1)],
                                    lhs_dilation=(1, 2), rhs_dilation=(2, 3),
                                    feature_group_count=2,
                                    dimension_numbers=("NCHW", "OIHW", "NCHW"))


@_register("conv_grad_maxpool_grad", lambda r: (_f32(r, 1, 6, 6, 2), _f32(r, 3, 3, 2, 3, scale=0.3)),
           rtol=1e-4, atol=1e-4, tags=("conv", "grad", "select_and_scatter"))
def conv_grad_maxpool_grad(x, w):
    # The backward pass of conv + max pool: transposed convolutions, select-and-scatter.
    def f(x, w):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        p = lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        return jnp.sum(jnp.sin(p))
    return jax.grad(f, argnums=(0, 1))(x, w)


# --- transformer pieces -------------------------------------------------------------------
def _layer_norm(x, g, b, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * g + b


def _transformer_params(r: np.random.RandomState, d: int = 16) -> dict:
    return {"ln1_g": 1 + _f32(r, d, scale=0.1), "ln1_b": _f32(r, d, scale=0.1),
            "wqkv": _f32(r, d, 3 * d, scale=d ** -0.5), "wo": _f32(r, d, d, scale=d ** -0.5),
            "ln2_g": 1 + _f32(r, d, scale=0.1), "ln2_b": _f32(r, d, scale=0.1),
            "w1": _f32(r, d, 4 * d, scale=d ** -0.5), "w2": _f32(r, 4 * d, d, scale=(4 * d) ** -0.5)}


@_register("transformer_block", lambda r: (_transformer_params(r), _f32(r, 2, 8, 16)),
           rtol=1e-4, atol=1e-4, tags=("attention", "dot", "softmax", "layer_norm"))
def transformer_block(p, x):
    b, t, d = x.shape
    heads = 2
    h = _layer_norm(x, p["ln1_g"], p["ln1_b"])
    q, k, v = jnp.split(h @ p["wqkv"], 3, axis=-1)
    split = lambda z: z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(d // heads).astype(np.float32)
    causal = jnp.tril(jnp.ones((t, t), bool))
    s = jnp.where(causal, s, -1e9)
    a = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bhqk,bhkd->bhqd", a, v).transpose(0, 2, 1, 3).reshape(b, t, d)
    x = x + o @ p["wo"]
    h = _layer_norm(x, p["ln2_g"], p["ln2_b"])
    return x + jax.nn.gelu(h @ p["w1"], approximate=True) @ p["w2"]


@_register("layer_norm_bf16", lambda r: (_bf16(r, 8, 64), _bf16(r, 64), _bf16(r, 64)),
           rtol=2e-2, atol=2e-2, tags=("bf16", "layer_norm"))
def layer_norm_bf16(x, g, b):
    return _layer_norm(x, g, b)


@_register("softmax_f32", lambda r: (_f32(r, 4, 33, scale=5.0),), tags=("softmax", "reduce"))
def softmax_f32(x):
    return jax.nn.softmax(x, axis=-1), jax.nn.softmax(x, axis=0)


@_register("gelu_exact_erf", lambda r: (_f32(r, 64, scale=2.0),), tags=("elementwise",))
def gelu_exact_erf(x):
    return jax.nn.gelu(x, approximate=False), jax.nn.silu(x), jax.nn.sigmoid(x)


# --- control flow -------------------------------------------------------------------------
@_register("scan_rnn", lambda r: (_f32(r, 6, 3, 4), _f32(r, 5, 5, scale=0.4), _f32(r, 4, 5, scale=0.4)),
           rtol=1e-5, atol=1e-5, tags=("scan", "while"))
def scan_rnn(xs, wh, wx):
    def cell(h, x):
        h = jnp.tanh(h @ wh + x @ wx)
        return h, h.sum(-1)
    return lax.scan(cell, jnp.zeros((xs.shape[1], 5), jnp.float32), xs)


@_register("while_loop_newton", lambda r: (np.abs(_f32(r, 8)) + 0.5, np.int32(3)),
           tags=("while",))
def while_loop_newton(a, extra):
    # Newton's iteration for sqrt with a data-dependent trip count plus an int counter.
    def cond(c):
        i, x = c
        return (i < 6 + extra) & jnp.any(jnp.abs(x * x - a) > 1e-6)

    def body(c):
        i, x = c
        return i + 1, 0.5 * (x + a / x)
    return lax.while_loop(cond, body, (jnp.int32(0), a))


@_register("fori_loop", lambda r: (_f32(r, 4, 4, scale=0.5),), tags=("while",))
def fori_loop(m):
    def body(i, acc):
        return acc @ m + jnp.float32(1.0) * i.astype(jnp.float32)
    return lax.fori_loop(0, 5, body, jnp.eye(4, dtype=jnp.float32))


@_register("cond_branches", lambda r: (_f32(r, 5), _f32(r, 5)), tags=("conditional",))
def cond_branches(x, y):
    a = lax.cond(jnp.sum(x) > 0, lambda u, v: jnp.sin(u) * v, lambda u, v: jnp.cos(u) - v, x, y)
    b = lax.cond(jnp.sum(x) <= 0, lambda u, v: jnp.sin(u) * v, lambda u, v: jnp.cos(u) - v, x, y)
    return a, b


@_register("switch_branches", lambda r: (_f32(r, 6), np.int32(7)), tags=("conditional",))
def switch_branches(x, i):
    branches = [lambda v: v + 1.0, lambda v: v * 3.0, lambda v: -v, lambda v: jnp.exp(v)]
    # lax.switch clamps the index into range: 7 -> branch 3, -2 -> branch 0.
    return (lax.switch(i, branches, x), lax.switch(i - 9, branches, x),
            lax.switch(i % 4 - 2, branches, x))


# --- gather / scatter ---------------------------------------------------------------------
@_register("gather_indexing", lambda r: (_f32(r, 10, 6), _ints(r, -10, 10, (7,)), _ints(r, 0, 6, (10, 3))),
           tags=("gather",))
def gather_indexing(x, idx, idx2):
    # Negative indices wrap (jnp semantics); take_along_axis along the last axis;
    # an out-of-range dynamic index clamps (lax semantics under jit for x[i]).
    return x[idx], x[:, idx2[0]], jnp.take_along_axis(x, idx2, axis=1), x[idx[:3], 1:4]


@_register("scatter_updates", lambda r: (_f32(r, 8, 3), _ints(r, 0, 8, (12,)), _f32(r, 12, 3),
                                         _ints(r, 0, 5, (20,)), _f32(r, 20)),
           tags=("scatter",))
def scatter_updates(x, idx, upd, seg, vals):
    uniq = jnp.array([6, 1, 3], jnp.int32)
    return (x.at[idx].add(upd),                     # duplicate indices accumulate
            x.at[uniq].set(upd[:3]),                 # unique indices
            x.at[idx].max(upd),
            x.at[idx].min(upd),
            x.at[idx].mul(upd),
            jax.ops.segment_sum(vals, seg, num_segments=5),
            x.at[jnp.array([9, -1, 2])].add(1.0))    # out-of-bounds update dropped, -1 wraps


# --- sorting and selection ----------------------------------------------------------------
@_register("sort_argsort", lambda r: (np.round(_f32(r, 4, 9), 1), _ints(r, -5, 5, (12,))),
           tags=("sort",))
def sort_argsort(x, k):
    # Rounded values make ties: stable argsort must keep their original order.
    return (jnp.sort(x, axis=-1), jnp.argsort(x, axis=0, stable=True), jnp.sort(k),
            lax.sort((k, jnp.arange(12, dtype=jnp.int32)), num_keys=1, is_stable=True),
            jnp.sort(x, axis=1, descending=True))


@_register("sort_nan_inf", lambda r: (np.array([3.0, np.nan, -np.inf, 0.0, -0.0, np.inf, -1.0, np.nan],
                                                np.float32),), tags=("sort",))
def sort_nan_inf(x):
    # jnp.sort's comparator is a total order: -inf < ... < -0.0 == 0.0? (NaNs go last).
    return jnp.sort(x), jnp.argsort(x, stable=True)


@_register("top_k", lambda r: (_f32(r, 3, 20),), tags=("sort", "topk"))
def top_k(x):
    v, i = lax.top_k(x, 5)
    return v, i


@_register("argmax_argmin", lambda r: (np.round(_f32(r, 6, 7), 0),), tags=("reduce",))
def argmax_argmin(x):
    # Ties: the first index wins. A NaN wins argmax/argmin too.
    xn = x.at[2, 3].set(jnp.nan)
    return (jnp.argmax(x, axis=1), jnp.argmin(x, axis=0), jnp.argmax(x),
            jnp.argmax(xn, axis=1), jnp.argmin(xn, axis=1))


# --- random numbers -----------------------------------------------------------------------
@_register("rng_threefry_exact", lambda r: (np.int32(42),), rtol=0.0, atol=0.0, tags=("rng",))
def rng_threefry_exact(seed):
    key = jax.random.PRNGKey(seed)
    k1, k2, k3 = jax.random.split(key, 3)
    return (jax.random.bits(k1, (4, 5), jnp.uint32), jax.random.uniform(k2, (16,)),
            jax.random.bernoulli(k3, 0.3, (4, 8)), jax.random.fold_in(key, 7))


@_register("rng_normal", lambda r: (np.int32(7),), rtol=1e-5, atol=1e-6, tags=("rng",))
def rng_normal(seed):
    key = jax.random.PRNGKey(seed)
    ka, kb = jax.random.split(key)
    return jax.random.normal(ka, (6, 5)), jax.random.permutation(kb, 10)


@_register("dropout", lambda r: (_f32(r, 4, 16), np.uint32(1234)), rtol=0.0, atol=0.0, tags=("rng",))
def dropout(x, seed):
    keep = jax.random.bernoulli(jax.random.PRNGKey(seed), 0.75, x.shape)
    return jnp.where(keep, x * 2.0, 0.0)


# --- complex numbers and FFT --------------------------------------------------------------
@_register("complex_arith", lambda r: (_f32(r, 12), _f32(r, 12), _f32(r, 12)),
           rtol=1e-5, atol=1e-5, tags=("complex",))
def complex_arith(a, b, c):
    z = lax.complex(a, b)
    w = lax.complex(c, a)
    return (z * w, z / w, jnp.abs(z), jnp.conj(z) + w, jnp.exp(z), jnp.angle(w),
            jnp.real(z * z), jnp.imag(jnp.sqrt(z)), jnp.sum(z * w))


@_register("fft_family", lambda r: (_f32(r, 3, 16), _f32(r, 3, 16)), rtol=1e-4, atol=1e-4,
           tags=("complex", "fft"))
def fft_family(re, im):
    z = lax.complex(re, im)
    return (jnp.fft.fft(z), jnp.fft.ifft(z), jnp.fft.rfft(re), jnp.fft.irfft(jnp.fft.rfft(re)),
            jnp.fft.fft2(z.reshape(3, 4, 4)), jnp.fft.irfft(z[:, :9], n=16))


# --- mixed precision and integer arithmetic -----------------------------------------------
@_register("bf16_matmul_f32_acc", lambda r: (_bf16(r, 16, 64), _bf16(r, 64, 8)),
           rtol=1e-5, atol=1e-4, tags=("bf16", "dot"))
def bf16_matmul_f32_acc(a, b):
    return lax.dot(a, b, preferred_element_type=jnp.float32), jnp.einsum(
        "ik,kj->ij", a, b, preferred_element_type=jnp.float32)


@_register("bf16_matmul_bf16_out", lambda r: (_bf16(r, 16, 64), _bf16(r, 64, 8)),
           rtol=1e-2, atol=2e-2, tags=("bf16", "dot"))
def bf16_matmul_bf16_out(a, b):
    # The bf16 dot is rounded to bf16 by the HLO; XLA:CPU folds the following convert into
    # the dot (f32 result, no rounding), so the second leaf only agrees to bf16 precision.
    return a @ b, (a @ b).astype(jnp.float32) * 2.0


@_register("int8_matmul_int32", lambda r: (_ints(r, -128, 128, (8, 32), np.int8),
                                           _ints(r, -128, 128, (32, 6), np.int8)),
           tags=("int", "dot"))
def int8_matmul_int32(a, b):
    return (lax.dot(a, b, preferred_element_type=jnp.int32),
            lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32).sum())


@_register("s8_bf16_scaled_neg", lambda r: (_ints(r, -128, 128, (16, 32), np.int8), _bf16(r, 32, 24)),
           rtol=1e-2, atol=1e-1, tags=("bf16", "int", "dot"))
def s8_bf16_scaled_neg(a, b):
    return -((a.astype(jnp.bfloat16) @ b) * 0.125)


@_register("int_overflow_bitwise",
           lambda r: (_ints(r, -2**31, 2**31 - 1, (16,)), _ints(r, -2**31, 2**31 - 1, (16,)),
                      _ints(r, -128, 128, (16,), np.int8), _ints(r, -128, 128, (16,), np.int8),
                      _ints(r, -40, 40, (16,))),
           tags=("int",))
def int_overflow_bitwise(a, b, c, d, s):
    nz = jnp.where(b == 0, 1, b)
    dz = jnp.where(d == 0, jnp.int8(1), d)
    return (a + b, a * b, a - b, c + d, c * d, -c,                 # two's complement wrap
            lax.shift_left(a, s), lax.shift_right_arithmetic(a, s),  # s in [-40, 40): out of range
            lax.shift_right_logical(a, s),
            a & b, a | b, a ^ b, ~a, lax.population_count(a), lax.clz(a),
            lax.div(a, nz), lax.rem(a, nz), a // nz, a % nz,       # C vs floor semantics
            lax.div(c, dz), lax.rem(c, dz), jnp.abs(c),
            jnp.maximum(a, b), jnp.minimum(c, d))


@_register("unsigned_and_convert", lambda r: (_ints(r, 0, 2**31 - 1, (12,)).astype(np.uint32),
                                              _f32(r, 12, scale=300.0)), tags=("int", "convert"))
def unsigned_and_convert(u, x):
    return (u * np.uint32(2654435761), u >> np.uint32(3), (u + np.uint32(2**31)) // np.uint32(7),
            x.astype(jnp.int32), x.astype(jnp.uint8).astype(jnp.int32), x.astype(jnp.bfloat16),
            x.astype(jnp.float16), u.astype(jnp.float32), (x > 0).astype(jnp.int8),
            lax.bitcast_convert_type(x, jnp.int32), lax.reduce_precision(x, 5, 10))


# --- composition: calls, remat, vmap ------------------------------------------------------
@jax.jit
def _inner_jitted(x, w):
    return jnp.tanh(x @ w)


def _named_piece(x):
    return jax.nn.relu(x) * 2.0 + 1.0


@_register("nested_jit_named_call", lambda r: (_f32(r, 4, 6), _f32(r, 6, 6, scale=0.4)),
           tags=("call",))
def nested_jit_named_call(x, w):
    y = _inner_jitted(x, w)
    y = _inner_jitted(y, w)                    # the same callee twice
    return jax.named_call(_named_piece, name="named_piece")(y)


@_register("checkpoint_remat", lambda r: (_f32(r, 5, 8), _f32(r, 8, 8, scale=0.3)),
           rtol=1e-4, atol=1e-5, tags=("grad", "remat"))
def checkpoint_remat(x, w):
    @jax.checkpoint
    def layer(h):
        return jnp.sin(h @ w)

    def loss(x, w_):
        return jnp.sum(layer(layer(x)) ** 2)
    return jax.value_and_grad(loss, argnums=0)(x, w)


@_register("vmap_per_example", lambda r: (_f32(r, 6, 5), _f32(r, 6, 5, 3), _ints(r, 0, 5, (6,))),
           tags=("vmap", "gather", "dynamic_slice"))
def vmap_per_example(v, m, i):
    def one(vec, mat, j):
        return vec @ mat + lax.dynamic_index_in_dim(vec, j, keepdims=False)
    return jax.vmap(one)(v, m, i)


# --- reductions and scans -----------------------------------------------------------------
@_register("cumulative_ops", lambda r: (_f32(r, 5, 7, scale=0.5), _ints(r, -3, 4, (9,))),
           rtol=1e-5, atol=1e-5, tags=("reduce_window", "cumulative"))
def cumulative_ops(x, k):
    return (jnp.cumsum(x, axis=1), jnp.cumprod(1.0 + 0.1 * x, axis=0), lax.cummax(x, axis=1),
            lax.cummin(x, axis=0, reverse=True), jnp.cumsum(k), lax.cumlogsumexp(x, axis=1))


@_register("reductions", lambda r: (_f32(r, 4, 5, 6), _ints(r, -50, 50, (4, 5))),
           rtol=1e-5, atol=1e-5, tags=("reduce",))
def reductions(x, k):
    return (x.sum(axis=(0, 2)), x.max(axis=1), x.min(), x.prod(axis=2), jnp.mean(x, axis=0),
            jnp.var(x, axis=-1), jnp.any(x > 2.0, axis=1), jnp.all(k < 40), k.sum(axis=0),
            k.max(axis=1), jnp.linalg.norm(x, axis=-1))


@_register("logsumexp", lambda r: (_f32(r, 4, 10, scale=20.0),), tags=("reduce", "softmax"))
def logsumexp(x):
    inf_row = x.at[0].set(-jnp.inf)            # an all -inf row gives -inf, not NaN
    return jax.nn.logsumexp(x, axis=-1), jax.nn.logsumexp(inf_row, axis=-1), jax.nn.logsumexp(x)


@_register("one_hot_cross_entropy", lambda r: (_f32(r, 8, 12), _ints(r, 0, 12, (8,))),
           tags=("softmax", "reduce"))
def one_hot_cross_entropy(logits, labels):
    oh = jax.nn.one_hot(labels, 12)
    per_ex = -jnp.sum(oh * jax.nn.log_softmax(logits), axis=-1)
    return per_ex, per_ex.mean(), oh


# --- elementwise and data movement --------------------------------------------------------
@_register("elementwise_math", lambda r: (_f32(r, 32, scale=2.0), np.abs(_f32(r, 32)) + 0.1),
           rtol=2e-5, atol=1e-5, tags=("elementwise",))
def elementwise_math(x, p):
    return (jnp.exp(x), jnp.log(p), jnp.sin(x), jnp.cos(x), jnp.tan(x * 0.3), jnp.tanh(x),
            lax.erf(x), lax.rsqrt(p), jnp.sqrt(p), jnp.cbrt(x), jnp.expm1(x * 0.01),
            jnp.log1p(p * 0.01), jnp.power(p, x), jnp.arctan2(x, p - 0.5), jnp.floor(x),
            jnp.ceil(x), jnp.round(x), lax.round(x * 2.0, lax.RoundingMethod.AWAY_FROM_ZERO),
            jnp.sign(x), x ** 3, jnp.remainder(x, 0.7), lax.rem(x, 0.7), jnp.arcsin(jnp.clip(x, -1, 1)),
            jnp.isfinite(x / (x - x[0])), lax.nextafter(x, p))


@_register("where_clip_select", lambda r: (_f32(r, 5, 6), _f32(r, 5, 6)), tags=("elementwise",))
def where_clip_select(x, y):
    xn = x.at[0, 0].set(jnp.nan)
    return (jnp.where(x > y, x, y), jnp.clip(x, -0.5, 0.5), lax.select(x < 0, -x, y),
            jnp.maximum(xn, y), jnp.minimum(xn, 0.0), lax.clamp(-0.3, xn, 0.3),
            jnp.where(jnp.isnan(xn), 0.0, xn), x / jnp.where(y > 0, y, 0.0))


@_register("pad_concat_reverse", lambda r: (_f32(r, 3, 4), _f32(r, 2, 4)), tags=("data_movement",))
def pad_concat_reverse(x, y):
    return (jnp.pad(x, ((1, 2), (0, 3))), jnp.pad(x, 1, mode="edge"), jnp.pad(x, 2, mode="reflect"),
            lax.pad(x, 0.5, [(1, -1, 1), (-2, 1, 2)]),   # interior and negative padding
            jnp.concatenate([x, y, x], axis=0), jnp.flip(x, axis=(0, 1)), jnp.roll(x, 2, axis=1),
            jnp.tile(y, (2, 1)), jnp.stack([x[:2], y], axis=1), x.T[::2, ::-1])


@_register("dynamic_slice_update", lambda r: (_f32(r, 6, 8), _f32(r, 2, 3), np.int32(3), np.int32(7)),
           tags=("dynamic_slice",))
def dynamic_slice_update(x, u, i, j):
    # Start indices clamp so that the window stays in bounds: (3, 7) -> (3, 5) for a 2x3 window.
    return (lax.dynamic_slice(x, (i, j), (2, 3)), lax.dynamic_update_slice(x, u, (i, j)),
            lax.dynamic_slice(x, (i - 10, j), (3, 2)), lax.dynamic_update_slice(x, u, (-i, 1)),
            lax.dynamic_slice_in_dim(x, i, 2, axis=0))


@_register("iota_broadcast_transpose", lambda r: (_f32(r, 3, 4, 5),), tags=("data_movement",))
def iota_broadcast_transpose(x):
    r = jnp.arange(5, dtype=jnp.float32)
    return (x.transpose(2, 0, 1) + r[:, None, None], x.reshape(12, 5) * r, jnp.outer(r, r),
            jnp.broadcast_to(x[:, :1, :], (3, 4, 5)), jnp.tril(jnp.ones((4, 4), jnp.int32)),
            jnp.expand_dims(x.sum(1), 0).squeeze())


# --- linear algebra -----------------------------------------------------------------------
@_register("linalg_cholesky_solve", lambda r: (_spd(r, 5), _f32(r, 5, 3)), rtol=1e-4, atol=1e-4,
           tags=("linalg", "custom_call"))
def linalg_cholesky_solve(a, b):
    l = jnp.linalg.cholesky(a)
    return l, jnp.linalg.solve(a, b), jax.scipy.linalg.cho_solve((l, True), b)


@_register("triangular_solve", lambda r: (np.tril(_f32(r, 4, 4)) + 4 * np.eye(4, dtype=np.float32),
                                          _f32(r, 4, 3), _f32(r, 2, 4)),
           rtol=1e-4, atol=1e-4, tags=("linalg",))
def triangular_solve(a, b, c):
    ts = lax.linalg.triangular_solve
    return (ts(a, b, left_side=True, lower=True),
            ts(a, b, left_side=True, lower=True, transpose_a=True),
            ts(a, c, left_side=False, lower=True),
            ts(a.T, b, left_side=True, lower=False, unit_diagonal=True),
            ts(a, c, left_side=False, lower=True, transpose_a=True, conjugate_a=False))


@_register("linalg_qr", lambda r: (_f32(r, 6, 4),), rtol=1e-4, atol=1e-4, tags=("linalg", "custom_call"))
def linalg_qr(a):
    q, r = jnp.linalg.qr(a)
    return q, r, q @ r


@_register("linalg_eigh", lambda r: (_spd(r, 5),), rtol=1e-4, atol=1e-4, tags=("linalg", "custom_call"))
def linalg_eigh(a):
    # Eigenvectors are defined up to sign: compare |v| and the reconstruction, not v itself.
    w, v = jnp.linalg.eigh(a)
    return w, jnp.abs(v), (v * w) @ v.T


@_register("einsum_batched", lambda r: (_f32(r, 3, 4, 5), _f32(r, 3, 5, 6), _f32(r, 2, 3, 4, 5)),
           rtol=1e-5, atol=1e-5, tags=("dot",))
def einsum_batched(a, b, c):
    return (jnp.einsum("bij,bjk->bik", a, b), jnp.einsum("hbij,bij->hb", c, a),
            jnp.einsum("bij,bkj->bik", a, a), jnp.einsum("ii->i", a[0, :4, :4]))


# --- model-shaped snippets ----------------------------------------------------------------
def _boxes(r: np.random.RandomState) -> np.ndarray:
    xy = np.abs(_f32(r, 16, 8, 2)) * 5
    return np.concatenate([xy, xy + np.abs(_f32(r, 16, 8, 2)) * 3 + 0.1], axis=-1)


@_register("giou_boxes", lambda r: (_boxes(r), _boxes(r)),
           rtol=1e-5, atol=1e-5, tags=("elementwise", "slice"))
def giou_boxes(b1, b2):
    # Generalized IoU of boxes (x1, y1, x2, y2) f32[16,8,4]: elementwise math on slices.
    area = lambda b: (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])  # noqa: E731
    lt = jnp.maximum(b1[..., :2], b2[..., :2])
    rb = jnp.minimum(b1[..., 2:], b2[..., 2:])
    wh = jnp.clip(rb - lt, 0.0)
    inter = wh[..., 0] * wh[..., 1]
    union = area(b1) + area(b2) - inter
    iou = inter / union
    lt_c = jnp.minimum(b1[..., :2], b2[..., :2])
    rb_c = jnp.maximum(b1[..., 2:], b2[..., 2:])
    wh_c = jnp.clip(rb_c - lt_c, 0.0)
    hull = wh_c[..., 0] * wh_c[..., 1]
    return iou - (hull - union) / hull


@_register("f64_program", lambda r: (r.standard_normal((6, 6)), r.standard_normal(6),
                                     np.int64(2**40)),
           rtol=1e-12, atol=1e-12, tags=("x64",))
def f64_program(a, v, big):
    # Under x64: f64 math and int64 arithmetic beyond 32 bits.
    y = jnp.tanh(a @ v) + jnp.exp(-jnp.abs(v)) * jnp.log1p(jnp.abs(a).sum(0))
    return y, jnp.cumsum(y), big * 3 + jnp.arange(6, dtype=jnp.int64), (a * 1e200).max()


def by_name(name: str) -> ZooProgram:
    return _BY_NAME[name]


_BY_NAME = {p.name: p for p in ZOO}
assert len(_BY_NAME) == len(ZOO), "duplicate zoo program names"


# --- comparing results --------------------------------------------------------------------
def leaf_paths(tree: Any) -> tuple[list[str], list[Any], Any]:
    """(names, leaves, treedef) of a pytree; names read like ``[0]['w1']``."""
    with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    names = [jax.tree_util.keystr(p) or "<root>" for p, _ in with_path]
    return names, [leaf for _, leaf in with_path], treedef


def flatten_value(value: Any) -> list[Any]:
    """An interpreter value (array or nested tuples of arrays) as a flat list of leaves."""
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in flatten_value(v)]
    return [value]


def _is_exact_dtype(dtype: np.dtype) -> bool:
    return dtype == np.bool_ or np.issubdtype(dtype, np.integer)


def assert_leaf_close(actual: Any, expected: Any, rtol: float, atol: float, name: str) -> None:
    """Compare one leaf: same dtype and shape; ints/bools exactly; floats within tolerance.

    ``rtol == atol == 0`` asks for bit-exact floats (NaNs compare equal to NaNs)."""
    exp = np.asarray(expected)
    act = np.asarray(actual)
    dtype = exp.dtype
    assert act.dtype == exp.dtype, f"leaf {name}: dtype {act.dtype}, expected {exp.dtype}"
    assert act.shape == exp.shape, f"leaf {name}: shape {act.shape}, expected {exp.shape}"
    if _is_exact_dtype(exp.dtype):
        np.testing.assert_array_equal(act, exp, err_msg=f"leaf {name} ({exp.dtype}) differs")
        return
    if not np.issubdtype(exp.dtype, np.complexfloating):
        # bf16/f16/f8 through float64 so numpy's comparison machinery accepts them.
        act, exp = act.astype(np.float64), exp.astype(np.float64)
    if rtol == 0 and atol == 0:
        np.testing.assert_array_equal(act, exp, err_msg=f"leaf {name} ({dtype}) not bit-exact")
    else:
        np.testing.assert_allclose(act, exp, rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=f"leaf {name} ({dtype})")


def assert_trees_close(actual: Any, expected: Any, rtol: float, atol: float) -> None:
    """Compare two pytrees leaf by leaf (same structure), naming the leaf that differs."""
    names, exp_leaves, exp_def = leaf_paths(expected)
    _, act_leaves, act_def = leaf_paths(actual)
    assert act_def == exp_def, f"output structure {act_def}, expected {exp_def}"
    for name, a, e in zip(names, act_leaves, exp_leaves):
        assert_leaf_close(a, e, rtol, atol, name)


def assert_flat_close(actual_value: Any, expected: Any, rtol: float, atol: float) -> None:
    """Compare an interpreter value (flat tuple or single array) with JAX's output pytree."""
    names, exp_leaves, _ = leaf_paths(expected)
    act_leaves = flatten_value(actual_value)
    assert len(act_leaves) == len(exp_leaves), (
        f"{len(act_leaves)} results, expected {len(exp_leaves)} ({names})")
    for name, a, e in zip(names, act_leaves, exp_leaves):
        assert_leaf_close(a, e, rtol, atol, name)

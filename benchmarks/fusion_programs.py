"""The GPU benchmark programs the fusion report and tests compile deviceless.

Each entry: name -> (function, argument ShapeDtypeStructs, small argument ShapeDtypeStructs
for evaluating, anchor file name under /work/shared/anchors/xla_gpu_h200 or None).
"""
from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

S = jax.ShapeDtypeStruct
bf16, f32, s8 = jnp.bfloat16, jnp.float32, jnp.int8


def softmax(x):
    return jax.nn.softmax(x, axis=-1)


def layer_norm(x, gamma, beta, eps=1e-5):
    """x*gamma+beta normalized per row; mean and variance in f32, result in x's dtype."""
    xf = x.astype(f32)
    mean = xf.mean(-1, keepdims=True)
    var = ((xf - mean) ** 2).mean(-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps) * gamma.astype(f32) + beta.astype(f32)
    return y.astype(x.dtype)


def int8_gemm(a, b):
    return -((a.astype(bf16) @ b) * 0.125)


def giou(a, b):
    """Generalized IoU of box sets [..., 4] = (x1, y1, x2, y2)."""
    ax1, ay1, ax2, ay2 = (a[..., k] for k in range(4))
    bx1, by1, bx2, by2 = (b[..., k] for k in range(4))
    area_a = (ax2 - ax1) * (ay2 - ay1)
    area_b = (bx2 - bx1) * (by2 - by1)
    iw = jnp.maximum(jnp.minimum(ax2, bx2) - jnp.maximum(ax1, bx1), 0.0)
    ih = jnp.maximum(jnp.minimum(ay2, by2) - jnp.maximum(ay1, by1), 0.0)
    inter = iw * ih
    union = area_a + area_b - inter
    iou = inter / union
    cw = jnp.maximum(ax2, bx2) - jnp.minimum(ax1, bx1)
    ch = jnp.maximum(ay2, by2) - jnp.minimum(ay1, by1)
    hull = cw * ch
    return iou - (hull - union) / hull


def transformer_block(x, ln1_g, ln1_b, w_qkv, w_o, ln2_g, ln2_b, w_1, w_2, heads=16):
    """Pre-LN block: x + attn(ln1(x)); then + mlp(ln2(.)) with gelu. Causal attention."""
    B, T, D = x.shape
    dh = D // heads
    h = layer_norm(x, ln1_g, ln1_b)
    qkv = h @ w_qkv                                            # [B, T, 3D]
    q, k, v = jnp.split(qkv, 3, axis=-1)
    q, k, v = (t.reshape(B, T, heads, dh) for t in (q, k, v))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(f32) * (1.0 / dh ** 0.5)
    mask = jnp.tril(jnp.ones((T, T), bool))
    s = jnp.where(mask, s, -1e30)
    p = jax.nn.softmax(s, axis=-1).astype(bf16)
    o = jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(B, T, D)
    x = x + o @ w_o
    h = layer_norm(x, ln2_g, ln2_b)
    return x + jax.nn.gelu(h @ w_1) @ w_2


def mlp(x, w1, w2):
    return jax.nn.gelu(x @ w1) @ w2


def _block_args(B: int, T: int, D: int) -> tuple:
    return (S((B, T, D), bf16), S((D,), bf16), S((D,), bf16), S((D, 3 * D), bf16),
            S((D, D), bf16), S((D,), bf16), S((D,), bf16), S((D, 4 * D), bf16),
            S((4 * D, D), bf16))


PROGRAMS: dict[str, tuple[Callable, tuple, tuple, Optional[str]]] = {
    "softmax_f32": (softmax, (S((8192, 4096), f32),), (S((4, 16), f32),),
                    "xla_softmax_f32.hlo.txt"),
    "layernorm_bf16": (layer_norm, (S((8192, 4096), bf16), S((4096,), bf16), S((4096,), bf16)),
                       (S((4, 16), bf16), S((16,), bf16), S((16,), bf16)),
                       "xla_layernorm_bf16.hlo.txt"),
    "int8_gemm": (int8_gemm, (S((1024, 512), s8), S((512, 2048), bf16)),
                  (S((8, 4), s8), S((4, 16), bf16)), None),
    "giou": (giou, (S((1024, 256, 4), f32), S((1024, 256, 4), f32)),
             (S((4, 3, 4), f32), S((4, 3, 4), f32)), None),
    "mlp_bf16": (mlp, (S((4096, 4096), bf16), S((4096, 16384), bf16), S((16384, 4096), bf16)),
                 (S((8, 16), bf16), S((16, 32), bf16), S((32, 16), bf16)),
                 "xla_mlp_bf16.hlo.txt"),
    "transformer_block": (transformer_block, _block_args(8, 1024, 1024), _block_args(2, 8, 32),
                          None),
}

# XLA:GPU's kernel count for the transformer block (the figure).
XLA_GPU_TRANSFORMER_KERNELS = 17

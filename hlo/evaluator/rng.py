"""Random numbers: ``rng-bit-generator`` bit-exact with XLA, and ``rng``.

``rng-bit-generator`` follows XLA's expansion of the op (the RngBitGeneratorExpander and
its ThreeFry-2x32 / Philox-4x32-10 generators): the state is ``u64[n]`` with the key in
element 0; ThreeFry's counter is element 1; Philox's 128-bit counter is elements (1, 2)
when n >= 3, else (state[1], state[0]) as (low, high). ``rng_default`` is Philox, which is
what XLA:CPU (and GPU) choose. Outputs narrower than 32 bits keep the low bits of a 32-bit
draw, as XLA does.

``rng`` (the old stateful op) is implementation-defined in XLA; here it draws from numpy's
PCG64 seeded with ``ctx.rng_state``, which advances by one per instruction evaluated, so
results are deterministic per run but differ from XLA's.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import DType
from ..errors import EvaluationError, UnimplementedError
from ..ops import rule
from .numerics import from_bits

_U32 = np.uint32
_U64 = np.uint64


def _lo32(x: np.ndarray) -> np.ndarray:
    return (x & _U64(0xFFFFFFFF)).astype(_U32)


def _hi32(x: np.ndarray) -> np.ndarray:
    return (x >> _U64(32)).astype(_U32)


def _join64(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return lo.astype(_U64) | (hi.astype(_U64) << _U64(32))


# --- ThreeFry-2x32, 20 rounds --------------------------------------------------------------
_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)


def _rotl(v: np.ndarray, d: int) -> np.ndarray:
    return (v << _U32(d)) | (v >> _U32(32 - d))


def threefry2x32(x0: np.ndarray, x1: np.ndarray, k0: int, k1: int) -> tuple[np.ndarray, np.ndarray]:
    ks = [_U32(k0), _U32(k1), _U32(0x1BD11BDA ^ k0 ^ k1)]
    x0 = x0 + ks[0]
    x1 = x1 + ks[1]
    for block in range(5):
        for r in _ROTATIONS[:4] if block % 2 == 0 else _ROTATIONS[4:]:
            x0 = x0 + x1
            x1 = _rotl(x1, r) ^ x0
        x0 = x0 + ks[(block + 1) % 3]
        x1 = x1 + ks[(block + 2) % 3] + _U32(block + 1)
    return x0, x1


def _split_shape(dims: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """XLA's SplitShapeIntoHalves: (half shape, split dim); -1 for a scalar."""
    if not dims:
        return (1,), -1
    even = [i for i, d in enumerate(dims) if d % 2 == 0]
    split = even[0] if even else max(range(len(dims)), key=lambda i: (dims[i], -i))
    half = list(dims)
    half[split:split + 1] = [-(-dims[split] // 2), 1]
    return tuple(half), split


def _threefry_bits32(key: int, counter: int, dims: tuple[int, ...]) -> tuple[np.ndarray, int]:
    half, split = _split_shape(dims)
    n = int(np.prod(half))
    with np.errstate(over="ignore"):
        inputs = _U64(counter) + np.arange(n, dtype=_U64)
        o0, o1 = threefry2x32(_lo32(inputs), _hi32(inputs), key & 0xFFFFFFFF, key >> 32)
    new_counter = (counter + n) % (1 << 64)
    if split < 0:
        return o0.reshape(()), new_counter
    both = np.concatenate([o0.reshape(half), o1.reshape(half)], axis=split + 1)
    full = list(dims)
    full[split] = half[split] * 2
    out = both.reshape(full)
    return out[tuple(slice(0, d) for d in dims)], new_counter


def _threefry_bits64(key: int, counter: int, dims: tuple[int, ...]) -> tuple[np.ndarray, int]:
    n = int(np.prod(dims))
    with np.errstate(over="ignore"):
        inputs = _U64(counter) + np.arange(n, dtype=_U64)
        o0, o1 = threefry2x32(_lo32(inputs), _hi32(inputs), key & 0xFFFFFFFF, key >> 32)
    return _join64(o0, o1).reshape(dims), (counter + n) % (1 << 64)


# --- Philox-4x32, 10 rounds ----------------------------------------------------------------
def philox4x32(x: list[np.ndarray], k0: int, k1: int) -> list[np.ndarray]:
    key = [_U32(k0), _U32(k1)]
    for _ in range(10):
        p0 = x[0].astype(_U64) * _U64(0xD2511F53)
        p1 = x[2].astype(_U64) * _U64(0xCD9E8D57)
        x = [_hi32(p1) ^ x[1] ^ key[0], _lo32(p1), _hi32(p0) ^ x[3] ^ key[1], _lo32(p0)]
        key = [key[0] + _U32(0x9E3779B9), key[1] + _U32(0xBB67AE85)]
    return x


def _philox_blocks(key: int, lo: int, hi: int, blocks: int) -> tuple[list[np.ndarray], int, int]:
    """``blocks`` Philox outputs (4 u32 lanes each) for counters (lo, hi) + [0, blocks)."""
    with np.errstate(over="ignore"):
        c_lo = _U64(lo) + np.arange(blocks, dtype=_U64)
        c_hi = np.where(c_lo < _U64(lo), _U64((hi + 1) % (1 << 64)), _U64(hi)).astype(_U64)
        out = philox4x32([_lo32(c_lo), _hi32(c_lo), _lo32(c_hi), _hi32(c_hi)],
                         key & 0xFFFFFFFF, key >> 32)
    new_lo = (lo + blocks) % (1 << 64)
    new_hi = (hi + (1 if new_lo < lo else 0)) % (1 << 64)
    return out, new_lo, new_hi


def _philox_bits(key: int, lo: int, hi: int, dims: tuple[int, ...], bits: int
                 ) -> tuple[np.ndarray, int, int]:
    n = int(np.prod(dims))
    if bits == 64:
        lanes, new_lo, new_hi = _philox_blocks(key, lo, hi, -(-n // 2))
        words = np.stack([_join64(lanes[0], lanes[1]), _join64(lanes[2], lanes[3])], axis=1)
    else:
        lanes, new_lo, new_hi = _philox_blocks(key, lo, hi, -(-n // 4))
        words = np.stack(lanes, axis=1)
    return words.reshape(-1)[:n].reshape(dims), new_lo, new_hi


def rng_bit_generator(algorithm: str, state: np.ndarray, dtype: DType,
                      dims: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(new state, random values of ``dtype``) exactly as XLA computes them."""
    if state.dtype != np.uint64 or state.ndim != 1 or state.shape[0] < 2:
        raise EvaluationError(f"rng-bit-generator state must be u64[n>=2], got {state.dtype}"
                              f"{list(state.shape)}")
    if dtype.bits not in (8, 16, 32, 64) or dtype.is_complex or dtype.is_pred:
        raise UnimplementedError(f"rng-bit-generator output type {dtype}")
    s = [int(v) for v in state]
    key = s[0]
    wide = 64 if dtype.bits == 64 else 32
    if algorithm == "rng_three_fry":
        if wide == 64:
            values, counter = _threefry_bits64(key, s[1], dims)
        else:
            values, counter = _threefry_bits32(key, s[1], dims)
        new_state = [key, counter] + s[2:]
    elif algorithm in ("rng_philox", "rng_default"):
        lo, hi = (s[1], s[2]) if len(s) >= 3 else (s[1], s[0])
        values, new_lo, new_hi = _philox_bits(key, lo, hi, dims, wide)
        new_state = [key, new_lo, new_hi] + s[3:] if len(s) >= 3 else [key, new_lo]
    else:
        raise EvaluationError(f"unknown rng algorithm {algorithm!r}")
    if wide == 32 and dtype.bits < 32:
        values = values & _U32((1 << dtype.bits) - 1)   # XLA keeps the low bits
    values = from_bits(values, dtype)
    return np.asarray(new_state, dtype=_U64), np.asarray(values).reshape(dims)


@rule("evaluate", "rng-bit-generator")
def _rng_bit_generator(inst, ops, ctx):
    algorithm = str(inst.attrs.get("algorithm", "rng_default"))
    value_shape = inst.shape.elements[1]
    return rng_bit_generator(algorithm, np.asarray(ops[0]), value_shape.dtype, value_shape.dims)


@rule("evaluate", "rng")
def _rng(inst, ops, ctx):
    distribution = str(inst.attrs.get("distribution", ""))
    gen = np.random.Generator(np.random.PCG64(ctx.rng_state))
    ctx.rng_state += 1
    dtype = inst.shape.dtype
    dims = inst.shape.dims
    a, b = (np.asarray(o) for o in ops[:2])
    if distribution == "rng_uniform":
        if dtype.is_integer:
            if int(b) <= int(a):
                return np.full(dims, a, dtype.np_dtype)
            return gen.integers(int(a), int(b), size=dims).astype(dtype.np_dtype)
        u = gen.random(size=dims)
        return (float(a) + u * (float(b) - float(a))).astype(dtype.np_dtype)
    if distribution == "rng_normal":
        return (float(a) + float(b) * gen.standard_normal(size=dims)).astype(dtype.np_dtype)
    raise EvaluationError(f"rng: unknown distribution {distribution!r}")

"""A blocked matmul written as a Pallas kernel, in the style TPU kernels are written, and
the HLO ``dot`` library call of target ``tpu`` built on it.

    c = blocked_matmul(a, b, block_m=128, block_n=128, block_k=128)   # [M,K] @ [K,N]
    c = blocked_matmul(a, b)                                          # [B,M,K] @ [B,K,N]

The TPU kernel (``style="tpu"``) is the canonical TPU shape: a grid over
``(batch, M/bm, N/bn, K/bk)``; BlockSpecs whose index maps pick the ``(bm, bk)`` tile of
``a``, the ``(bk, bn)`` tile of ``b`` and the ``(bm, bn)`` tile of the output for each grid
point; K innermost and marked "arbitrary" (a sequential reduction axis: consecutive grid
steps revisit the same output tile), the others "parallel". A VMEM scratch accumulator
(f32, or int32 for integer inputs, as the MXU accumulates) is zeroed at ``k == 0`` and
written out, converted to the output type, at the last ``k`` (``pl.when``).

That kernel relies on TPU grid semantics: grid steps run one after another on a core, so a
scratch buffer carries the partial sum from one K step to the next. GPU Pallas (Triton)
runs grid points in parallel and has no such carried scratch, so ``style="gpu"`` is the
GPU formulation of the same blocked algorithm: a grid over ``(batch, M/bm, N/bn)`` and a
``fori_loop`` over the K tiles inside the kernel, accumulating in registers.

On the CPU both run through Pallas' interpret mode (``interpret=True``: the kernel body is
executed as ordinary JAX ops, grid step by grid step), which is how they are tested here.
With a GPU present ``interpret`` defaults to False and the GPU style is chosen; that path
(the Triton lowering) is not exercised by the CPU test suite.

Numerics: the result equals XLA's dot with ``preferred_element_type`` = the HLO result type
up to summation order: floats are multiplied and summed in f32 and rounded once to the
output type; int8 x int8 sums exactly in int32 (wrapping modulo 2**32, as the MXU and
XLA:CPU's s32 result do).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

from hlo.errors import InvalidArgumentError, UnimplementedError
from hlo.ir import Instruction

from . import register

# How many times the ``dot`` library call ran the Pallas kernel (tests read it to check that
# a compiled program's dots really went through here).
CALLS = {"dot": 0}

# Element types the kernel takes as inputs (the MXU's: f32, bf16, f16 and int8).
SUPPORTED_INPUTS = ("float32", "bfloat16", "float16", "int8")



# --- the kernels ------------------------------------------------------------------------------
def _dot_tile(a: Any, b: Any, acc_dtype: Any) -> Any:
    """One tile product, summed in the accumulator type (the MXU step)."""
    import jax.numpy as jnp
    from jax import lax
    if a.dtype != b.dtype:      # e.g. s8 x bf16: widen the narrower side in-register
        common = jnp.promote_types(a.dtype, b.dtype)
        a, b = a.astype(common), b.astype(common)
    # f32 x f32 at full precision: on a TPU the default would be bf16 passes on the MXU,
    # and the reference (XLA:CPU's dot) is an f32 BLAS call.
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return jnp.dot(a, b, preferred_element_type=acc_dtype, precision=precision)


def _tpu_kernel(a_ref: Any, b_ref: Any, o_ref: Any, acc_ref: Any) -> None:
    """Grid point (b, i, j, k): acc[i, j] += a[b, i, k] @ b[b, k, j]; K is the last axis."""
    from jax.experimental import pallas as pl
    import jax.numpy as jnp
    k = pl.program_id(3)

    @pl.when(k == 0)
    def _zero() -> None:
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += _dot_tile(a_ref[...], b_ref[...], acc_ref.dtype)

    @pl.when(k == pl.num_programs(3) - 1)
    def _store() -> None:
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _gpu_kernel(a_ref: Any, b_ref: Any, o_ref: Any, *, block_k: int, acc_dtype: Any) -> None:
    """Grid point (b, i, j): loop over the K tiles of row block i and column block j."""
    from jax.experimental import pallas as pl
    import jax.numpy as jnp
    from jax import lax
    bm, bn = o_ref.shape
    steps = a_ref.shape[-1] // block_k

    def body(k: Any, acc: Any) -> Any:
        a = a_ref[:, pl.ds(k * block_k, block_k)]
        b = b_ref[pl.ds(k * block_k, block_k), :]
        return acc + _dot_tile(a, b, acc_dtype)

    acc = lax.fori_loop(0, steps, body, jnp.zeros((bm, bn), acc_dtype))
    o_ref[...] = acc.astype(o_ref.dtype)


@functools.lru_cache(maxsize=None)
def _compiled(shape_a: tuple, shape_b: tuple, dtype_a: str, dtype_b: str, out_dtype: str,
              blocks: tuple[int, int, int], style: str, interpret: bool) -> Callable:
    """A jitted pallas_call for padded operands [B, Mp, Kp] x [B, Kp, Np] (one per signature:
    tracing a pallas_call costs a fraction of a second, running the jitted one far less)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    nb, mp, kp = shape_a
    np_ = shape_b[2]
    bm, bn, bk = blocks
    acc = _accumulator(np.dtype(jnp.dtype(dtype_a)), np.dtype(jnp.dtype(dtype_b)))
    out = jax.ShapeDtypeStruct((nb, mp, np_), jnp.dtype(out_dtype))
    if style == "tpu":
        call = pl.pallas_call(
            _tpu_kernel,
            out_shape=out,
            grid=(nb, mp // bm, np_ // bn, kp // bk),
            in_specs=[pl.BlockSpec((None, bm, bk), lambda b, i, j, k: (b, i, k)),
                      pl.BlockSpec((None, bk, bn), lambda b, i, j, k: (b, k, j))],
            out_specs=pl.BlockSpec((None, bm, bn), lambda b, i, j, k: (b, i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), acc)],
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
            interpret=interpret,
            name="blocked_matmul")
    else:
        call = pl.pallas_call(
            functools.partial(_gpu_kernel, block_k=bk, acc_dtype=acc),
            out_shape=out,
            grid=(nb, mp // bm, np_ // bn),
            in_specs=[pl.BlockSpec((None, bm, kp), lambda b, i, j: (b, i, 0)),
                      pl.BlockSpec((None, kp, bn), lambda b, i, j: (b, 0, j))],
            out_specs=pl.BlockSpec((None, bm, bn), lambda b, i, j: (b, i, j)),
            interpret=interpret,
            name="blocked_matmul")
    return jax.jit(call)


def _accumulator(da: np.dtype, db: np.dtype) -> np.dtype:
    return np.dtype(np.int32) if da.kind == db.kind == "i" else np.dtype(np.float32)


def _check_dtype(what: str, d: np.dtype) -> None:
    if d.name not in SUPPORTED_INPUTS:
        raise UnimplementedError(f"blocked_matmul: {what} has element type {d.name}; the "
                                 f"kernel takes {', '.join(SUPPORTED_INPUTS)}")


def _default_accelerator() -> Optional[str]:
    """"gpu" or "tpu" when JAX's default backend is one, else None (the CPU)."""
    import jax
    backend = jax.default_backend()
    return backend if backend in ("gpu", "tpu") else None


# --- the public kernel entry point -----------------------------------------------------------
def blocked_matmul(a: Any, b: Any, *, block_m: int = 128, block_n: int = 128,
                   block_k: int = 128, out_dtype: Any = None, interpret: Optional[bool] = None,
                   style: Optional[str] = None) -> Any:
    """``a @ b`` as a blocked Pallas kernel: [M,K] x [K,N] -> [M,N] or, batched,
    [B,M,K] x [B,K,N] -> [B,M,N] (a leading grid axis over B).

    ``out_dtype`` is the preferred element type (default: the promoted input type for
    floats, int32 for int8 x int8). ``interpret`` defaults to True unless JAX's default
    backend is a GPU or TPU; ``style`` ("tpu" or "gpu") defaults to "gpu" on a GPU and
    "tpu" otherwise. Returns a JAX array.
    """
    import jax.numpy as jnp
    # Check the caller's element types before JAX sees them (without x64 it would quietly
    # turn a float64 array into float32).
    for what, x in (("lhs", a), ("rhs", b)):
        dtype = getattr(x, "dtype", None)     # (a numpy dtype is falsy: test for None)
        _check_dtype(what, np.dtype(dtype if dtype is not None else np.asarray(x).dtype))
    a, b = jnp.asarray(a), jnp.asarray(b)
    if a.ndim != b.ndim or a.ndim not in (2, 3):
        raise InvalidArgumentError(f"blocked_matmul takes two rank-2 or two rank-3 operands, "
                                   f"got shapes {a.shape} and {b.shape}")
    batched = a.ndim == 3
    if not batched:
        a, b = a[None], b[None]
    nb, m, k = a.shape
    if b.shape[0] != nb or b.shape[1] != k:
        raise InvalidArgumentError(f"blocked_matmul: shapes {tuple(a.shape)} and "
                                   f"{tuple(b.shape)} do not multiply (batch and K must agree)")
    n = b.shape[2]
    da, db = np.dtype(a.dtype), np.dtype(b.dtype)
    for name, v in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        if not isinstance(v, int) or v <= 0:
            raise InvalidArgumentError(f"blocked_matmul: {name} must be a positive int, got {v!r}")
    acc = _accumulator(da, db)
    if out_dtype is None:
        out = acc if acc.kind == "i" else np.dtype(jnp.promote_types(da, db))
    else:
        out = np.dtype(jnp.dtype(out_dtype))
    accel = _default_accelerator()
    if interpret is None:
        interpret = accel is None
    if style is None:
        style = "gpu" if accel == "gpu" else "tpu"
    if style not in ("tpu", "gpu"):
        raise InvalidArgumentError(f"blocked_matmul: style must be 'tpu' or 'gpu', got {style!r}")

    if 0 in (nb, m, n, k):      # nothing to tile: an empty result, or a sum over nothing
        res = jnp.zeros((nb, m, n), out)
        return res if batched else res[0]
    # A dim smaller than its block gets one block of the whole dim (legal on a TPU: a block
    # may always span the full array dim).
    bm, bn, bk = min(block_m, m), min(block_n, n), min(block_k, k)
    # Pad every dim up to a whole number of blocks. K must be padded with zeros: a block that
    # runs past the array edge reads unspecified values (garbage on a TPU, whatever the
    # interpreter pads with), and those would be summed into every output element. Zero
    # rows/columns add exactly nothing. M and N are padded too, so that every grid point
    # works on a full tile; the extra rows and columns are sliced off the result.
    mp, np_, kp = -(-m // bm) * bm, -(-n // bn) * bn, -(-k // bk) * bk
    if (mp, kp) != (m, k):
        a = jnp.pad(a, ((0, 0), (0, mp - m), (0, kp - k)))
    if (kp, np_) != (k, n):
        b = jnp.pad(b, ((0, 0), (0, kp - k), (0, np_ - n)))
    fn = _compiled(tuple(a.shape), tuple(b.shape), da.name, db.name, out.name,
                   (bm, bn, bk), style, bool(interpret))
    res = fn(a, b)[:, :m, :n]
    return res if batched else res[0]


# --- HLO dot -> blocked_matmul ----------------------------------------------------------------
def to_bmk(lhs: np.ndarray, rhs: np.ndarray, lb: Sequence[int], rb: Sequence[int],
           lc: Sequence[int], rc: Sequence[int]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Transpose and reshape a general dot's operands to [B, M, K] and [B, K, N].

    HLO allows batch and contracting dims anywhere (``lhs_contracting_dims={0}`` is a
    transposed lhs); the kernel wants one batch, one row, one contraction axis. Several
    batch/free/contracting dims are flattened into one each (their order is the dot's own:
    batch dims in the listed order, then free dims in operand order). Returns the two
    operands and the dot's result dims (batch, lhs free, rhs free)."""
    lb, rb, lc, rc = list(lb), list(rb), list(lc), list(rc)
    lf = [d for d in range(lhs.ndim) if d not in lb and d not in lc]
    rf = [d for d in range(rhs.ndim) if d not in rb and d not in rc]
    size = lambda arr, dims: math.prod(arr.shape[d] for d in dims)  # noqa: E731
    nb, m, k, n = size(lhs, lb), size(lhs, lf), size(lhs, lc), size(rhs, rf)
    a = np.transpose(lhs, lb + lf + lc).reshape(nb, m, k)
    b = np.transpose(rhs, rb + rc + rf).reshape(nb, k, n)
    dims = [lhs.shape[d] for d in lb] + [lhs.shape[d] for d in lf] + [rhs.shape[d] for d in rf]
    return a, b, dims


def supports(inst: Instruction) -> bool:
    """Whether the kernel takes this dot: inputs of the MXU's types (f32, bf16, f16, s8;
    s8 mixed with a float type too) and a float or s32 result. Other dots (f64, complex,
    wider integers) stay with the reference dot."""
    if inst.opcode != "dot":
        return False
    ins = [o.shape.dtype.np_dtype.name for o in inst.operands]
    res = inst.shape.dtype.np_dtype.name
    if not all(d in SUPPORTED_INPUTS for d in ins):
        return False
    if all(d == "int8" for d in ins):
        return res in ("int32", "int8")
    return res in ("float32", "bfloat16", "float16")


@register("tpu", "dot")
def pallas_dot(inst: Instruction, operands: Sequence[np.ndarray], *,
               blocks: Optional[tuple[int, int, int]] = None,
               interpret: Optional[bool] = None) -> np.ndarray:
    """The ``dot`` library call of target ``tpu``: ``inst``'s dot on logical numpy operands,
    through ``blocked_matmul``, with the HLO result type as the preferred element type.
    Returns a logical numpy array of the result shape. ``supports(inst)`` says which dots
    it takes (the runtime keeps the reference dot for the others)."""
    if not supports(inst):
        kinds = " x ".join(o.shape.dtype.name for o in inst.operands)
        raise UnimplementedError(f"pallas dot: %{inst.name} ({kinds} -> "
                                 f"{inst.shape.dtype.name}) is not a type the kernel takes")
    lhs, rhs = (np.asarray(o) for o in operands)
    at = inst.attrs
    a, b, dims = to_bmk(lhs, rhs, at.get("lhs_batch_dims", ()), at.get("rhs_batch_dims", ()),
                        at.get("lhs_contracting_dims", ()), at.get("rhs_contracting_dims", ()))
    # 128 x 128 output tiles (the MXU's size), 128-deep K steps; blocked_matmul shrinks a
    # block to the whole dim when the dim is smaller.
    bm, bn, bk = blocks or (128, 128, 128)
    res_dtype = inst.shape.dtype.np_dtype
    out = blocked_matmul(a, b, block_m=bm, block_n=bn, block_k=bk, out_dtype=res_dtype,
                         interpret=interpret)
    CALLS["dot"] += 1
    return np.asarray(out).astype(res_dtype, copy=False).reshape(inst.shape.dims)



pallas_dot.supports = supports  # type: ignore[attr-defined]  (the runtime asks before using it)

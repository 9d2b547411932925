"""Runtime support for generated CPU kernels: thin wrappers over the interpreter's numerics.

Generated kernels must agree bit for bit with the reference interpreter (XLA:CPU
semantics), so every place where plain numpy would differ from XLA goes through a helper
here, and each helper delegates to the interpreter's own implementation instead of
re-deriving the semantics:

- ``fop``: float arithmetic in the compute type (f32 for bf16/f16/f8), rounded back to the
  storage type after every op, with XLA:CPU's DAZ/FTZ (``numerics.float_op``);
- ``convert``: XLA's convert (``elementwise.convert_array``);
- ``daz``: an operand as the FP unit reads it before a compare (compute type, DAZ);
- ``reduce``: the interpreter's vectorised reduction for one-op reducer bodies;
- ``eval_rule``: any op without a direct numpy lowering runs its interpreter rule.

Generated code sees this module as ``S`` and the HLO element types as ``F32``, ``BF16``...
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from hlo import dtypes as dt
from hlo.dtypes import DType
from hlo.evaluator.core import EvalContext, Evaluator
from hlo.evaluator import elementwise as _ew
from hlo.evaluator import reductions as _red
from hlo.evaluator.numerics import compute_dtype, flush_denormals, float_op
from hlo.ir import Instruction

# One context for every kernel: XLA:CPU numerics, single device. Rules that call other
# computations (a general reduce body, scatter's combiner) run them through it.
_CTX = EvalContext(Evaluator(), numerics="xla_cpu")

# The names generated code uses for element types: F32, BF16, S32, PRED, ...
DTYPE_NAMES: dict[str, DType] = {d.name.upper(): d for d in dt.all_dtypes()
                                 if d.np_dtype is not None}


def fop(fn: Callable[..., np.ndarray], dtype: DType, *args: np.ndarray) -> np.ndarray:
    """A float op as XLA:CPU computes it: in f32 for narrow types, rounded back to
    ``dtype`` after the op, subnormal inputs and results flushed to zero."""
    return float_op(fn, dtype, *args, flush=True)


def fop_exact(fn: Callable[..., np.ndarray], dtype: DType, *args: np.ndarray) -> np.ndarray:
    """A sign-bit float op (negate, abs): no flushing, subnormals survive."""
    return float_op(fn, dtype, *args, flush=False)


def convert(x: np.ndarray, to: DType) -> np.ndarray:
    """XLA's convert (saturating float->int, wrapping int->int, RNE to floats, DAZ)."""
    return _ew.convert_array(np.asarray(x), to, flush=True)


def daz(x: np.ndarray) -> np.ndarray:
    """A float operand as a compare reads it: widened to the compute type, subnormals as 0."""
    x = np.asarray(x)
    return flush_denormals(x.astype(compute_dtype(dt.from_numpy(x.dtype)), copy=False))


# maximum/minimum on floats: NaN-propagating with -0 < +0, the interpreter's definition.
float_max = _ew._float_max
float_min = _ew._float_min


def reduce(opcode: str, x: np.ndarray, axes: tuple[int, ...], init: np.ndarray,
           dtype: DType) -> np.ndarray:
    """A reduction whose body is one ``opcode`` of its two parameters (add, maximum...),
    computed exactly as the interpreter's fast path does (same order, same accumulator)."""
    return _red._fast_reduce(opcode, np.asarray(x), axes, np.asarray(init), dtype.np_dtype)


def eval_rule(inst: Instruction, *operands: Any) -> Any:
    """Run ``inst``'s interpreter rule: the lowering for ops numpy has no direct form for."""
    return inst.op.evaluate(inst, list(operands), _CTX)


# --- shifts: XLA gives 0 (or the sign fill) for amounts >= the bit width, numpy's C
# shifts are undefined there; the amount is read as unsigned (a negative one is huge).
def _shift_amount(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.dtype]:
    a, b = np.asarray(a), np.asarray(b)
    unsigned = np.dtype(f"u{a.dtype.itemsize}")
    amount = b.view(unsigned) if b.dtype != unsigned else b
    too_big = amount >= a.dtype.itemsize * 8
    return np.where(too_big, 0, amount).astype(unsigned), too_big, unsigned


def shift_left(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    amount, too_big, unsigned = _shift_amount(a, b)
    out = np.left_shift(np.asarray(a).view(unsigned), amount).view(np.asarray(a).dtype)
    return np.where(too_big, np.zeros((), out.dtype), out)


def shift_right_logical(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    amount, too_big, unsigned = _shift_amount(a, b)
    out = np.right_shift(np.asarray(a).view(unsigned), amount).view(np.asarray(a).dtype)
    return np.where(too_big, np.zeros((), out.dtype), out)


def shift_right_arithmetic(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    amount, too_big, _ = _shift_amount(a, b)
    signed = np.dtype(f"i{a.dtype.itemsize}")
    fill = np.where(too_big, a.dtype.itemsize * 8 - 1, amount).astype(signed)
    return np.right_shift(a.view(signed), fill).view(a.dtype)


def result(x: Any, copy: bool) -> Any:
    """A kernel output as a fresh array: views (broadcast, transpose, reshape of an input)
    are copied so that a caller may write into the result without touching the inputs.
    A tuple-shaped output (a variadic reduce at the root) stays a tuple of arrays."""
    if isinstance(x, tuple):
        return tuple(result(v, copy) for v in x)
    return np.array(x) if copy else np.asarray(x)


def bitcast_elements(x: np.ndarray, dtype: DType, dims: tuple[int, ...]) -> np.ndarray:
    """A bitcast that also changes the element type (same width; XLA:CPU's layout passes
    emit these): the bytes of the physical array reread as ``dtype``."""
    return np.ascontiguousarray(x).view(dtype.np_dtype).reshape(dims)

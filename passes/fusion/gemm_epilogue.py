"""Epilogues a library GEMM applies itself: GELU (tanh form) on the dot's result.

cuBLASLt runs ``act(A @ B)`` as one GEMM whose epilogue transforms each accumulator tile
before it is stored; the tanh approximation of GELU is one of its epilogues (XLA's GEMM
rewriter hands the same pattern to cuBLASLt). A GEMM fusion whose computation after the
dot is exactly that GELU then costs one GEMM, not a GEMM plus a loop kernel that reads the
product back (on the H200, bf16 8192x1024x4096: 139 -> 111 µs, benchmarks/NOTES.md).

The match is by value, not by the shape of the expression tree: each node after the dot is
read as ``A(x) + B(x) * tanh(T(x))`` with A, B, T polynomials in the dot's result x
(constants folded, converts between float types seen through). GELU's tanh form is
``0.5 x + 0.5 x * tanh(k x + k c x^3)`` with k = sqrt(2/pi), c = 0.044715, so any way of
writing it (``x * 0.5 * (1 + tanh(...))``, ``0.5 * x * ...``, ``x**3`` as ``x * x * x``)
gives the same A, B and T. Coefficients must agree to the precision of the type the
epilogue computes in (bf16 constants are rounded: 0.044715 is stored as 0.04468).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from hlo.ir import Instruction

Poly = dict[int, float]        # power of x -> coefficient

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715
# The relative error a coefficient may carry: a constant rounded to the type's precision.
_REL_TOL = {"bf16": 2.0 ** -7, "f16": 2.0 ** -10, "f32": 1e-6, "f64": 1e-12}


class _NoMatch(Exception):
    pass


def _add(p: Poly, q: Poly, sign: float = 1.0) -> Poly:
    out = dict(p)
    for e, c in q.items():
        out[e] = out.get(e, 0.0) + sign * c
    return {e: c for e, c in out.items() if c != 0.0}


def _mul(p: Poly, q: Poly) -> Poly:
    out: Poly = {}
    for e1, c1 in p.items():
        for e2, c2 in q.items():
            if e1 + e2 > 8:            # nothing GELU-like is of higher degree
                raise _NoMatch()
            out[e1 + e2] = out.get(e1 + e2, 0.0) + c1 * c2
    return {e: c for e, c in out.items() if c != 0.0}


def _scalar_constant(inst: Instruction) -> Optional[float]:
    while inst.opcode in ("broadcast", "convert", "bitcast", "reshape"):
        if inst.opcode == "bitcast" and inst.shape.dtype != inst.operands[0].shape.dtype:
            return None
        inst = inst.operands[0]
    if inst.opcode != "constant" or inst.literal is None:
        return None
    try:
        import numpy as np
        values = np.asarray(inst.literal, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        return None
    if values.size == 0 or not np.all(values == values[0]):
        return None
    return float(values[0])


class _Reader:
    """Reads the cone above ``x`` as (A, B) with the value ``A + B * tanh(T)``."""

    def __init__(self, x: Instruction):
        self.x = x
        self.tanh_arg: Optional[Poly] = None
        self.memo: dict[int, tuple[Poly, Poly]] = {}

    def read(self, inst: Instruction) -> tuple[Poly, Poly]:
        got = self.memo.get(id(inst))
        if got is None:
            got = self.memo[id(inst)] = self._read(inst)
        return got

    def _read(self, inst: Instruction) -> tuple[Poly, Poly]:
        if inst is self.x:
            return {1: 1.0}, {}
        c = _scalar_constant(inst)
        if c is not None:
            return ({0: c} if c else {}), {}
        op = inst.opcode
        if not inst.shape.is_array or not inst.shape.dtype.is_float:
            raise _NoMatch()
        if op in ("convert", "copy") or (op in ("bitcast", "reshape") and
                                         inst.shape.dims == inst.operands[0].shape.dims):
            return self.read(inst.operands[0])
        if op == "negate":
            a, b = self.read(inst.operands[0])
            return _add({}, a, -1.0), _add({}, b, -1.0)
        if op in ("add", "subtract"):
            (a1, b1), (a2, b2) = self.read(inst.operands[0]), self.read(inst.operands[1])
            sign = 1.0 if op == "add" else -1.0
            return _add(a1, a2, sign), _add(b1, b2, sign)
        if op == "multiply":
            (a1, b1), (a2, b2) = self.read(inst.operands[0]), self.read(inst.operands[1])
            if b1 and b2:
                raise _NoMatch()       # tanh squared: not an epilogue
            if b1:
                (a1, b1), (a2, b2) = (a2, b2), (a1, b1)
            return _mul(a1, a2), _mul(a1, b2)
        if op == "divide":
            (a1, b1), (a2, b2) = self.read(inst.operands[0]), self.read(inst.operands[1])
            if b2 or set(a2) != {0}:
                raise _NoMatch()       # only division by a constant
            inv = {0: 1.0 / a2[0]}
            return _mul(a1, inv), _mul(b1, inv)
        if op == "tanh":
            a, b = self.read(inst.operands[0])
            if b or (self.tanh_arg is not None and self.tanh_arg != a):
                raise _NoMatch()
            self.tanh_arg = a
            return {}, {0: 1.0}
        raise _NoMatch()


def _close(poly: Poly, want: Poly, tol: float) -> bool:
    if set(poly) != set(want):
        return False
    return all(abs(poly[e] - want[e]) <= tol * abs(want[e]) for e in want)


def library_epilogue(dot: Instruction, epilogue: Sequence[Instruction],
                     outputs: Sequence[Instruction]) -> Optional[str]:
    """``"gelu_tanh"`` when ``epilogue`` (the instructions after ``dot`` in a GEMM fusion)
    computes exactly GELU's tanh form of the dot's result as the group's one output, of the
    dot's shape and type; else None."""
    if len(outputs) != 1 or not epilogue:
        return None
    out = outputs[0]
    if not out.shape.is_array or out.shape.dims != dot.shape.dims or \
            out.shape.dtype != dot.shape.dtype:
        return None
    inside = {id(i) for i in epilogue}
    if any(id(o) not in inside and o is not dot and _scalar_constant(o) is None
           for i in epilogue for o in i.operands):
        return None                     # reads another array than the dot's result
    compute = {i.shape.dtype.name for i in epilogue if i.shape.is_array}
    tol = max(_REL_TOL.get(t, 0.0) for t in compute | {dot.shape.dtype.name})
    if tol == 0.0:
        return None
    reader = _Reader(dot)
    try:
        a, b = reader.read(out)
    except _NoMatch:
        return None
    if reader.tanh_arg is None:
        return None
    k = _SQRT_2_OVER_PI
    if _close(a, {1: 0.5}, tol) and _close(b, {1: 0.5}, tol) and \
            _close(reader.tanh_arg, {1: k, 3: k * _GELU_CUBIC}, 2 * tol):
        return "gelu_tanh"
    return None

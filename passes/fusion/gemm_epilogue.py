"""Epilogues a library GEMM applies itself: a bias vector, then GELU (tanh form) or ReLU;
or a residual added to the product.

cuBLASLt runs ``act(A @ B + bias)`` as one GEMM whose epilogue transforms each accumulator
tile before it is stored; a bias over the output columns, ReLU and the tanh approximation
of GELU are among its epilogues (XLA's GEMM rewriter hands the same patterns to cuBLASLt).
A GEMM fusion whose computation after the dot is exactly one of them then costs one GEMM,
not a GEMM plus a loop kernel that reads the product back (on the H200, bf16
8192x1024x4096 + GELU: 139 -> 111 µs, benchmarks/NOTES.md).

GELU is matched by value, not by the shape of the expression tree: each node after the dot
(or after the bias add) is read as ``A(x) + B(x) * tanh(T(x))`` with A, B, T polynomials in x
(constants folded, converts between float types seen through). GELU's tanh form is
``0.5 x + 0.5 x * tanh(k x + k c x^3)`` with k = sqrt(2/pi), c = 0.044715, so any way of
writing it (``x * 0.5 * (1 + tanh(...))``, ``0.5 * x * ...``, ``x**3`` as ``x * x * x``)
gives the same A, B and T. Coefficients must agree to the precision of the type the
epilogue computes in (bf16 constants are rounded: 0.044715 is stored as 0.04468).

A residual ``dot + c`` (c an array of the product's shape and type, a transformer block's
``x + mlp(x)``) is the GEMM's ``beta = 1`` form, ``D = A @ B + C``, also what XLA's GEMM
rewriter makes of it. cuBLAS reads C once as it stores D; where buffer assignment lets the
result take over C's buffer (C dies at the GEMM) nothing else moves, otherwise the call
copies C into the result first, which moves what a separate add kernel would.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
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


@dataclass(frozen=True)
class LibraryEpilogue:
    """What the GEMM applies before storing: ``activation(dot + bias)``, or ``dot + addend``
    (no bias, no activation: torch's cuBLAS entry points take one or the other)."""
    activation: str                 # "gelu_tanh" | "relu" | "none"
    bias: Optional[Instruction]     # a vector over the last output dim, read from outside
    addend: Optional[Instruction] = None   # an array of the product's shape, read from outside

    @property
    def label(self) -> str:
        if self.addend is not None:
            return "residual add"
        parts = (["bias"] if self.bias is not None else []) + \
            ([] if self.activation == "none" else [self.activation.split("_")[0].upper()])
        return " + ".join(parts)

    @property
    def inputs(self) -> list[Instruction]:
        """The arrays the library call reads besides the dot's operands, in call order."""
        return [x for x in (self.bias, self.addend) if x is not None]


def _bias_of(add: Instruction, dot: Instruction, inside: set[int]) -> Optional[Instruction]:
    """The vector of ``add(dot, broadcast(vector))`` (either order) when it lies outside the
    epilogue and spans the dot's last dim, in the dot's type; else None."""
    if add.opcode != "add" or dot not in add.operands:
        return None
    other = add.operands[1] if add.operands[0] is dot else add.operands[0]
    if other.opcode != "broadcast" or id(other) not in inside:
        return None
    vec = other.operands[0]
    rank = dot.shape.rank
    if id(vec) in inside or vec.shape.rank != 1 or tuple(other.attrs.get("dimensions", ())) != \
            (rank - 1,) or vec.shape.dtype != dot.shape.dtype:
        return None
    return vec


def _addend_of(out: Instruction, dot: Instruction, inside: set[int]) -> Optional[Instruction]:
    """The array ``c`` of ``out = add(dot, c)`` (either order) when it comes from outside
    the epilogue with the product's shape and type; else None."""
    if out.opcode != "add" or dot not in out.operands or out.operands[0] is out.operands[1]:
        return None
    c = out.operands[1] if out.operands[0] is dot else out.operands[0]
    if id(c) in inside or _scalar_constant(c) is not None or not c.shape.is_array or \
            c.shape.dims != dot.shape.dims or c.shape.dtype != dot.shape.dtype:
        return None
    return c


def _is_relu_of(out: Instruction, v: Instruction) -> bool:
    if out.opcode != "maximum":
        return False
    a, b = out.operands
    return (a is v and _scalar_constant(b) == 0.0) or (b is v and _scalar_constant(a) == 0.0)


def _is_gelu_tanh_of(out: Instruction, v: Instruction, tol: float) -> bool:
    reader = _Reader(v)
    try:
        a, b = reader.read(out)
    except _NoMatch:
        return False
    if reader.tanh_arg is None:
        return False
    k = _SQRT_2_OVER_PI
    return _close(a, {1: 0.5}, tol) and _close(b, {1: 0.5}, tol) and \
        _close(reader.tanh_arg, {1: k, 3: k * _GELU_CUBIC}, 2 * tol)


def library_epilogue(dot: Instruction, epilogue: Sequence[Instruction],
                     outputs: Sequence[Instruction]) -> Optional[LibraryEpilogue]:
    """The epilogue cuBLASLt can apply when ``epilogue`` (the instructions after ``dot`` in a
    GEMM fusion, constants included) computes the group's one output, of the dot's shape
    and type, as GELU (tanh form), ReLU or nothing of ``dot`` or of ``dot + bias`` (a vector
    broadcast over the last dim), or as ``dot + c`` (``c`` an array of that shape and type
    read from outside); else None."""
    if len(outputs) != 1 or not epilogue:
        return None
    out = outputs[0]
    if not out.shape.is_array or out.shape.dims != dot.shape.dims or \
            out.shape.dtype != dot.shape.dtype or not dot.shape.dtype.is_float:
        return None
    inside = {id(i) for i in epilogue}
    addend = _addend_of(out, dot, inside)
    if addend is not None:
        # Only the add itself: anything more would have to run after the GEMM anyway.
        rest = [i for i in epilogue if i is not out and _scalar_constant(i) is None]
        return None if rest else LibraryEpilogue("none", None, addend)
    biased = [(i, b) for i in epilogue if (b := _bias_of(i, dot, inside)) is not None]
    v, bias = biased[0] if len(biased) == 1 else (dot, None)
    allowed = {id(dot)} | ({id(bias)} if bias is not None else set())
    if any(id(o) not in inside and id(o) not in allowed and _scalar_constant(o) is None
           for i in epilogue for o in i.operands):
        return None                     # reads another array than the dot's result and bias
    if bias is not None and any(dot in i.operands for i in epilogue if i is not v):
        return None                     # the product is also read without its bias
    if out is v:
        return LibraryEpilogue("none", bias) if bias is not None else None
    if _is_relu_of(out, v):
        return LibraryEpilogue("relu", bias)
    compute = {i.shape.dtype.name for i in epilogue if i.shape.is_array}
    tol = max(_REL_TOL.get(t, 0.0) for t in compute | {dot.shape.dtype.name})
    if tol > 0.0 and _is_gelu_tanh_of(out, v, tol):
        return LibraryEpilogue("gelu_tanh", bias)
    return None

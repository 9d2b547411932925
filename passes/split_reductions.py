"""``split-reductions``: a reduction to a few values becomes a row reduction + a small one.

A reduction that keeps few elements (a loss summed to a scalar, a mean over everything)
gives a row-reduction kernel few rows to spread over the GPU: the looped-rows template runs
one program per row block, so ``sum((out - y)**2)`` over 8M elements ran as ONE program on
the H200 (2.2-4.6 ms where the bytes take 15 µs; benchmarks/NOTES.md, i14-step). XLA's GPU
pipeline rewrites such reductions before fusion (its tree reduction rewriter); so does this
pass:

    reduce(x[4,2048,1024], dims={0,1,2})  ->  reduce(reduce(x, dims={2}), dims={0,1})

The first reduction runs over the physically minor-most reduced dims (contiguous rows of at
least ``row`` elements), with many rows: the row template's fast case, and what elementwise
producers (and multi-output siblings) fuse into. The second reduces the few partial results.
When the minor dim is the only reduced one (a 1-D sum), it is split in two through a free
row-major reshape. Only associative reducers with a neutral or idempotent init are split
(add/multiply with 0/1, max/min/and/or with any constant): the result is the same up to
the order of floating-point additions, as in XLA.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hlo.ir import Instruction, Module
from hlo.layout_util import is_default, major_to_minor
from hlo.shape import Layout, Shape

from .base import register_pass
from .rewrite import emit, is_value, scalar_constant_value

_NEUTRAL = {"add": 0, "multiply": 1}
_IDEMPOTENT = ("maximum", "minimum", "and", "or")


def _reducer_ok(inst: Instruction) -> bool:
    """A single scalar binary reducer whose init may be applied twice."""
    if len(inst.operands) != 2 or not inst.shape.is_array:
        return False
    body = inst.attrs.get("to_apply")
    root = getattr(body, "root", None)
    if root is None or len(body.instructions) != 3 or root.opcode not in (*_NEUTRAL, *_IDEMPOTENT):
        return False
    if sorted(o.opcode for o in root.operands) != ["parameter", "parameter"]:
        return False
    init = inst.operands[1]
    if scalar_constant_value(init) is None:
        return False
    return root.opcode in _IDEMPOTENT or is_value(init, _NEUTRAL[root.opcode])


def _drop_dims(shape: Shape, dims: set[int], dtype) -> Shape:
    """``shape`` without ``dims`` (element type ``dtype``), keeping the memory order."""
    keep = [d for d in range(shape.rank) if d not in dims]
    new_index = {d: k for k, d in enumerate(keep)}
    layout = None
    if shape.layout is not None:
        m2m = tuple(new_index[d] for d in shape.layout.minor_to_major if d in new_index)
        layout = Layout(m2m)
    return Shape(dtype, tuple(shape.dims[d] for d in keep), layout)


@register_pass
@dataclass(frozen=True)
class SplitReductions:
    """Reductions keeping at most ``max_kept`` elements, each of at least ``min_reduced``
    inputs, run as a row reduction (rows of >= ``row`` elements) then a small reduction."""
    name = "split-reductions"
    max_kept: int = 1024
    min_reduced: int = 1 << 16
    row: int = 1024

    def run(self, module: Module) -> bool:
        changed = False
        for comp in module.computations:
            if comp.fusion_instruction is not None:
                continue
            for inst in list(comp.instructions):
                if inst.opcode == "reduce" and self._split(inst):
                    changed = True
        return changed

    def _split(self, inst: Instruction) -> bool:
        if not _reducer_ok(inst):
            return False
        x, init = inst.operands
        dims = set(inst.attrs.get("dimensions", ()))
        kept = inst.shape.size
        if not dims or kept > self.max_kept or x.shape.size // max(kept, 1) < self.min_reduced:
            return False
        # The reduced dims that are minor-most in memory, until a row is long enough.
        inner: list[int] = []
        for d in reversed(major_to_minor(x.shape.layout, x.shape.rank)):
            if d not in dims or math.prod(x.shape.dims[i] for i in inner) >= self.row:
                break
            inner.append(d)
        if not inner:
            return False      # the minor dim is kept: a column reduction, left alone
        if math.prod(x.shape.dims[i] for i in inner) > 16 * self.row:
            # Rows this long would be few again (a 1-D sum: one row): cut the minor dim.
            x, inner, dims = self._reshape_minor(inst, x, dims, inner[0])
            if x is None:
                return False
        body = inst.attrs["to_apply"]
        partial_shape = _drop_dims(x.shape, set(inner), inst.shape.dtype)
        partial = emit(inst, "reduce", [x, init], partial_shape, name="reduce_rows",
                       dimensions=tuple(sorted(inner)), to_apply=body)
        left = [d for d in range(x.shape.rank) if d not in inner]
        rest = tuple(sorted(left.index(d) for d in dims if d not in inner))
        final = emit(inst, "reduce", [partial, init], inst.shape, name="reduce_partials",
                     dimensions=rest, to_apply=body)
        inst.replace_all_uses_with(final)
        inst.parent.remove_instruction(inst)
        return True

    def _reshape_minor(self, inst: Instruction, x: Instruction, dims: set[int], d: int):
        """Split the minor-most reduced dim ``d`` (size n) into (n / k, k) through a free
        row-major reshape: rows of k elements, n / k times more of them; the n / k part
        joins the dims reduced after. (None, ...) when x is not row-major or n has no
        divisor to use."""
        if not is_default(x.shape.layout):
            return None, [], dims
        n = x.shape.dims[d]
        k = self.row * 4
        while k >= 32 and (n % k or n // k < 2):
            k //= 2
        if k < 32:
            return None, [], dims
        new_dims = x.shape.dims[:d] + (n // k, k) + x.shape.dims[d + 1:]
        layout = None if x.shape.layout is None else Layout.row_major(len(new_dims))
        r = emit(inst, "reshape", [x], Shape(x.shape.dtype, new_dims, layout), name="reshape")
        moved = {e + 1 if e > d else e for e in dims} | {d + 1}
        return r, [d + 1], moved

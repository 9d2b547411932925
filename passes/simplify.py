"""The algebraic simplifier: a table of named rewrite rules (XLA's AlgebraicSimplifier).

Each rule is a short function from an instruction to its replacement. The table below is
the whole pass; a rule's name is what ``explain`` output and the dump report show.
Floating-point rules follow XLA: ``x + 0 -> x`` ignores the sign of zero; ``x - x -> 0``
is applied to integers only (NaN/inf make it wrong for floats).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from hlo.attrs import SliceDim, SliceSpec
from hlo.ir import Instruction, Module
from hlo.shape import Shape

from .base import register_pass
from .degenerate_dims import DEGENERATE_DIM_RULES
from .onehot_scatter import ONEHOT_RULES
from .rewrite import Rule, apply_rules, constant_like, emit, is_value, scalar_constant_value
from .transpose_sinking import TRANSPOSE_RULES


def _same(a: Instruction, b: Instruction) -> bool:
    return a.shape.compatible(b.shape)


def _forward_if_same_shape(inst: Instruction, x: Instruction) -> Instruction | None:
    return x if _same(inst, x) else None


# --- arithmetic identities --------------------------------------------------------------
def add_zero(i: Instruction):
    a, b = i.operands
    if is_value(b, 0):
        return _forward_if_same_shape(i, a)
    if is_value(a, 0):
        return _forward_if_same_shape(i, b)


def sub_zero(i: Instruction):
    a, b = i.operands
    if is_value(b, 0):
        return _forward_if_same_shape(i, a)


def sub_self_int(i: Instruction):
    a, b = i.operands
    if a is b and i.shape.dtype.is_integer:
        return constant_like(i, 0, i.shape)


def mul_one(i: Instruction):
    a, b = i.operands
    if is_value(b, 1):
        return _forward_if_same_shape(i, a)
    if is_value(a, 1):
        return _forward_if_same_shape(i, b)


def mul_zero_int(i: Instruction):
    a, b = i.operands
    if i.shape.dtype.is_integer and (is_value(a, 0) or is_value(b, 0)):
        return constant_like(i, 0, i.shape)


def div_one(i: Instruction):
    a, b = i.operands
    if is_value(b, 1):
        return _forward_if_same_shape(i, a)


def double_negation(i: Instruction):
    x = i.operands[0]
    if x.opcode == i.opcode:
        return x.operands[0]


def and_or_identity(i: Instruction):
    a, b = i.operands
    if a is b:
        return a
    if i.shape.dtype.is_pred:
        neutral, absorbing = (True, False) if i.opcode == "and" else (False, True)
        for x, y in ((a, b), (b, a)):
            if is_value(y, neutral):
                return _forward_if_same_shape(i, x)
            if is_value(y, absorbing):
                return constant_like(i, absorbing, i.shape)


def max_min_self(i: Instruction):
    a, b = i.operands
    if a is b:
        return a


def max_min_identity(i: Instruction):
    """max(x, -inf) -> x and min(x, +inf) -> x for floats (NaN stays NaN either way);
    for integers the type's lowest/highest value plays the same part."""
    dtype = i.shape.dtype
    if dtype.is_float:
        identity = -np.inf if i.opcode == "maximum" else np.inf
    elif dtype.is_integer:
        info = np.iinfo(dtype.np_dtype) if dtype.bits >= 8 else None
        if info is None:
            return None
        identity = info.min if i.opcode == "maximum" else info.max
    else:
        return None
    a, b = i.operands
    for x, y in ((a, b), (b, a)):
        if is_value(y, identity):
            return _forward_if_same_shape(i, x)


def select_constant_pred(i: Instruction):
    p, t, f = i.operands
    v = scalar_constant_value(p)
    if t is f:
        return t
    if v is None:
        return None
    return t if bool(v) else f


def convert_same_type(i: Instruction):
    x = i.operands[0]
    return x if _same(i, x) else None


def convert_convert_widening(i: Instruction):
    # convert(convert(x: A) -> B) -> C  ==  convert(x) -> C when B represents every A exactly
    x = i.operands[0]
    if x.opcode != "convert":
        return None
    src, mid = x.operands[0].shape.dtype, x.shape.dtype
    lossless = (src.is_float and mid.is_float and mid.bits >= src.bits and
                not (src.name == "bf16" and mid.name == "f16")) or \
               (src.is_integer and mid.is_integer and mid.bits > src.bits and
                (mid.is_signed or not src.is_signed))
    if not lossless:
        return None
    if x.operands[0].shape.compatible(i.shape):
        return x.operands[0]
    return emit(i, "convert", [x.operands[0]], i.shape, name="convert")


# --- data movement folding --------------------------------------------------------------
def reshape_noop(i: Instruction):
    x = i.operands[0]
    if _same(i, x):
        return x
    if x.opcode in ("reshape", "bitcast") and x.opcode == "reshape":
        return emit(i, "reshape", [x.operands[0]], i.shape, name="reshape")


def reshape_of_broadcast(i: Instruction):
    """reshape(broadcast(x)) that only adds/drops size-1 dims the broadcast made -> broadcast(x)."""
    b = i.operands[0]
    if b.opcode != "broadcast":
        return None
    src, out = b.shape.dims, i.shape.dims
    if [d for d in src if d != 1] != [d for d in out if d != 1]:
        return None
    bdims = tuple(b.attrs.get("dimensions", ()))
    if any(src[d] == 1 for d in bdims):
        return None  # an operand dim of size 1 could be dropped by the reshape
    big_in = [k for k, d in enumerate(src) if d != 1]
    big_out = [k for k, d in enumerate(out) if d != 1]
    where = dict(zip(big_in, big_out))
    return emit(i, "broadcast", [b.operands[0]], i.shape, name="broadcast",
                dimensions=tuple(where[d] for d in bdims))


def transpose_fold(i: Instruction):
    x = i.operands[0]
    perm = tuple(i.attrs.get("dimensions", ()))
    if perm == tuple(range(len(perm))):
        return _forward_if_same_shape(i, x)
    if x.opcode == "transpose":
        inner = tuple(x.attrs["dimensions"])
        composed = tuple(inner[p] for p in perm)
        src = x.operands[0]
        if composed == tuple(range(len(composed))):
            return src
        return emit(i, "transpose", [src], i.shape, name="transpose", dimensions=composed)


def broadcast_fold(i: Instruction):
    x = i.operands[0]
    dims = tuple(i.attrs.get("dimensions", ()))
    if _same(i, x) and dims == tuple(range(len(dims))):
        return x
    if x.opcode == "broadcast":
        inner = tuple(x.attrs.get("dimensions", ()))
        return emit(i, "broadcast", [x.operands[0]], i.shape, name="broadcast",
                    dimensions=tuple(dims[d] for d in inner))


def slice_fold(i: Instruction):
    x = i.operands[0]
    spec: SliceSpec = i.attrs["slice"]
    if _same(i, x) and all(d.start == 0 and d.stride == 1 for d in spec.dims):
        return x
    if x.opcode == "slice":
        inner: SliceSpec = x.attrs["slice"]
        dims = []
        for o, n in zip(inner.dims, spec.dims):
            start = o.start + n.start * o.stride
            stride = o.stride * n.stride
            count = max(0, -(-(n.limit - n.start) // n.stride))
            limit = start + (count - 1) * stride + 1 if count else start
            dims.append(SliceDim(start, limit, stride))
        return emit(i, "slice", [x.operands[0]], i.shape, name="slice", slice=SliceSpec(tuple(dims)))


def concatenate_fold(i: Instruction):
    ops = [o for o in i.operands if o.shape.size > 0] if i.shape.size > 0 else i.operands
    if len(ops) == 1:
        return _forward_if_same_shape(i, ops[0])
    if len(ops) < len(i.operands):
        return emit(i, "concatenate", ops, i.shape, name="concatenate",
                    dimensions=i.attrs["dimensions"])


def pad_noop(i: Instruction):
    x = i.operands[0]
    cfg = i.attrs["padding"]
    if all(d.low == 0 and d.high == 0 and d.interior == 0 for d in cfg.dims):
        return _forward_if_same_shape(i, x)


def reverse_noop(i: Instruction):
    x = i.operands[0]
    if all(x.shape.dims[d] == 1 for d in i.attrs.get("dimensions", ())):
        return x


def copy_noop(i: Instruction):
    x = i.operands[0]
    if isinstance(x.shape, Shape) and x.shape == i.shape:
        return x


def dot_transposed_operand(i: Instruction):
    """dot(transpose(a), b) -> dot(a, b) with the dimension numbers mapped through."""
    for side, other in (("lhs", "rhs"), ("rhs", "lhs")):
        idx = 0 if side == "lhs" else 1
        t = i.operands[idx]
        if t.opcode != "transpose":
            continue
        perm = tuple(t.attrs["dimensions"])
        batch = tuple(i.attrs.get(f"{side}_batch_dims", ()))
        contract = tuple(i.attrs.get(f"{side}_contracting_dims", ()))
        free = [d for d in range(len(perm)) if d not in batch and d not in contract]
        new_free = [perm[d] for d in free]
        # The dot's output orders free dims ascending, so the mapping must keep their order.
        if new_free != sorted(new_free):
            continue
        attrs = dict(i.attrs)
        attrs[f"{side}_batch_dims"] = tuple(perm[d] for d in batch)
        attrs[f"{side}_contracting_dims"] = tuple(perm[d] for d in contract)
        ordered = {}
        for k in ("lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims", "rhs_contracting_dims"):
            if k in attrs and (attrs[k] or k.endswith("contracting_dims")):
                ordered[k] = attrs.pop(k)
        attrs.pop("lhs_batch_dims", None)
        attrs.pop("rhs_batch_dims", None)
        ordered.update(attrs)
        operands = list(i.operands)
        operands[idx] = t.operands[0]
        return emit(i, "dot", operands, i.shape, name="dot", **ordered)


def reduce_size_one_dims(i: Instruction):
    """reduce over dims of size 1, or over none (with the reducer's identity as init), is
    a reshape."""
    if len(i.operands) != 2:
        return None
    x, init = i.operands
    dims = tuple(i.attrs.get("dimensions", ()))
    if any(x.shape.dims[d] != 1 for d in dims):   # no dims at all: nothing combined
        return None
    body = i.attrs["to_apply"]
    root = body.root
    if root is None or len(body.instructions) != 3 or root.opcode not in _IDENTITY:
        return None
    if scalar_constant_value(init) is None or not _is_identity(root.opcode, init, x):
        return None
    return emit(i, "reshape", [x], i.shape, name="reshape")


_IDENTITY = {"add": 0, "multiply": 1, "or": False, "and": True}


def static_dimension_size(i: Instruction):
    # Every dimension is static in hlotk's shapes, so get-dimension-size is a constant (XLA's
    # dynamic padder does the same for static dims); kernels and the host need not run it.
    return constant_like(i, i.operands[0].shape.dims[int(i.attrs["dimensions"][0])], i.shape)


def _is_identity(opcode: str, init: Instruction, x: Instruction) -> bool:
    if opcode in ("maximum", "minimum"):
        return False
    return is_value(init, _IDENTITY[opcode])


SIMPLIFY_RULES: list[Rule] = [
    Rule("add-zero", ("add",), add_zero),
    Rule("subtract-zero", ("subtract",), sub_zero),
    Rule("subtract-self-int", ("subtract",), sub_self_int),
    Rule("multiply-one", ("multiply",), mul_one),
    Rule("multiply-zero-int", ("multiply",), mul_zero_int),
    Rule("divide-one", ("divide",), div_one),
    Rule("double-negation", ("negate", "not"), double_negation),
    Rule("and-or-identity", ("and", "or"), and_or_identity),
    Rule("max-min-self", ("maximum", "minimum"), max_min_self),
    Rule("max-min-identity", ("maximum", "minimum"), max_min_identity),
    Rule("select-constant-pred", ("select",), select_constant_pred),
    Rule("convert-same-type", ("convert",), convert_same_type),
    Rule("convert-of-widening-convert", ("convert",), convert_convert_widening),
    Rule("reshape-fold", ("reshape",), reshape_noop),
    Rule("reshape-of-broadcast", ("reshape",), reshape_of_broadcast),
    Rule("transpose-fold", ("transpose",), transpose_fold),
    Rule("broadcast-fold", ("broadcast",), broadcast_fold),
    Rule("slice-fold", ("slice",), slice_fold),
    Rule("concatenate-fold", ("concatenate",), concatenate_fold),
    Rule("pad-noop", ("pad",), pad_noop),
    Rule("reverse-size-one", ("reverse",), reverse_noop),
    Rule("copy-noop", ("copy",), copy_noop),
    Rule("dot-transposed-operand", ("dot",), dot_transposed_operand),
    Rule("reduce-size-one-dims", ("reduce",), reduce_size_one_dims),
    Rule("static-dimension-size", ("get-dimension-size",), static_dimension_size),
] + DEGENERATE_DIM_RULES + TRANSPOSE_RULES + ONEHOT_RULES


@register_pass
@dataclass(frozen=True)
class Simplify:
    """Apply SIMPLIFY_RULES to a fixed point; ``last_stats`` is not kept (frozen pass):
    call ``simplify_with_stats`` to learn which rules fired."""
    name = "simplify"

    def run(self, module: Module) -> bool:
        return apply_rules(module, SIMPLIFY_RULES)


def simplify_with_stats(module: Module) -> tuple[bool, Counter]:
    stats: Counter = Counter()
    changed = apply_rules(module, SIMPLIFY_RULES, stats)
    return changed, stats

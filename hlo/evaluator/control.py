"""Control flow and calls: while, conditional, call, fusion, async wrappers, ids.

Called computations run through ``ctx.call``; async ops run their wrapped computation
synchronously at ``async-start`` and carry the result in the async tuple, which XLA shapes
as ((operands...), result, context...).
"""
from __future__ import annotations

import numpy as np

from ..errors import EvaluationError
from ..ops import rule


def _as_bool(value, what: str) -> bool:
    arr = np.asarray(value)
    if arr.shape != () or arr.dtype != np.bool_:
        raise EvaluationError(f"{what} must be a pred[] scalar, got {arr.dtype}{list(arr.shape)}")
    return bool(arr)


@rule("evaluate", "while")
def _while(inst, ops, ctx):
    cond, body = inst.attrs["condition"], inst.attrs["body"]
    state = ops[0]
    while _as_bool(ctx.call(cond, [state]), f"while %{inst.name} condition result"):
        state = ctx.call(body, [state])
    return state


@rule("evaluate", "conditional")
def _conditional(inst, ops, ctx):
    selector = np.asarray(ops[0])
    if "branch_computations" in inst.attrs:
        branches = list(inst.attrs["branch_computations"])
        if selector.dtype == np.bool_:
            # A pred selector with branch list: XLA orders it {true, false}.
            index = 0 if bool(selector) else 1
        else:
            index = int(selector)
            # Out-of-range indices (negative included) run the last branch.
            if index < 0 or index >= len(branches):
                index = len(branches) - 1
        return ctx.call(branches[index], [ops[1 + index]])
    taken = _as_bool(selector, f"conditional %{inst.name} predicate")
    comp = inst.attrs["true_computation" if taken else "false_computation"]
    return ctx.call(comp, [ops[1 if taken else 2]])


@rule("evaluate", "call")
def _call(inst, ops, ctx):
    return ctx.call(inst.attrs["to_apply"], ops)


@rule("evaluate", "fusion")
def _fusion(inst, ops, ctx):
    return ctx.call(inst.attrs["calls"], ops)


@rule("evaluate", "async-start")
def _async_start(inst, ops, ctx):
    result = ctx.call(inst.attrs["calls"], ops)
    # Shape: ((operands...), result, s32[] context) -- context elements are zeros.
    extra = ()
    if inst.shape.is_tuple and len(inst.shape.elements) > 2:
        extra = tuple(np.zeros(s.dims, s.dtype.np_dtype) if not s.is_tuple else ()
                      for s in inst.shape.elements[2:])
    return (tuple(ops), result) + extra


@rule("evaluate", "async-update")
def _async_update(inst, ops, ctx):
    return ops[0]


@rule("evaluate", "async-done")
def _async_done(inst, ops, ctx):
    return ops[0][1]


@rule("evaluate", "replica-id")
def _replica_id(inst, ops, ctx):
    return np.asarray(ctx.replica_id, dtype=np.uint32)


@rule("evaluate", "partition-id")
def _partition_id(inst, ops, ctx):
    return np.asarray(ctx.partition_id, dtype=np.uint32)

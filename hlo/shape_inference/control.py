"""Control flow and calls (while, conditional, call, fusion, map's cousins), async
wrappers, custom-call, rng, ids and host transfers."""
from __future__ import annotations

from typing import Any

from .. import dtypes as dt
from ..errors import ShapeError
from ..shape import AnyShape, Shape, TupleShape
from ._common import (array_operand, arity, computation_root_shape, infer, needs_shape,
                      result_check)

PRED_SCALAR = Shape(dt.PRED, ())
U32_SCALAR = Shape(dt.U32, ())


def check_params(op: str, comp: Any, shapes: list[AnyShape], what: str) -> None:
    """``comp`` takes exactly ``shapes`` (ignoring layouts)."""
    if comp is None:
        raise ShapeError(f"{op}: {what} computation is missing")
    params = [p.shape for p in comp.parameters]
    if len(params) != len(shapes):
        raise ShapeError(f"{op}: {what} computation %{comp.name} takes {len(params)} "
                         f"parameters but is given {len(shapes)} operands")
    for i, (p, s) in enumerate(zip(params, shapes)):
        if p is None or not p.compatible(s):
            raise ShapeError(f"{op}: {what} computation %{comp.name} parameter {i} is "
                             f"{p.to_text(False) if p is not None else 'missing'} but the "
                             f"operand is {s.to_text(False)}")


@infer("while")
def infer_while(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("while", shapes, 1)
    state = shapes[0]
    cond, body = attrs.get("condition"), attrs.get("body")
    check_params("while", cond, [state], "condition")
    check_params("while", body, [state], "body")
    c = computation_root_shape("while", cond, "condition")
    if not c.compatible(PRED_SCALAR):
        raise ShapeError(f"while: condition %{cond.name} must return pred[], returns {c}")
    b = computation_root_shape("while", body, "body")
    if not b.compatible(state):
        raise ShapeError(f"while: body %{body.name} returns {b} but the loop state is "
                         f"{state.to_text(False)}")
    return state.without_layout()


@infer("conditional")
def infer_conditional(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("conditional", shapes, (1, -1))
    sel = shapes[0]
    if "branch_computations" in attrs:
        branches = list(attrs["branch_computations"])
        if sel.is_tuple or sel.rank != 0 or sel.dtype != dt.S32:
            raise ShapeError(f"conditional: branch index must be s32[], got {sel}")
    else:
        branches = [attrs.get("true_computation"), attrs.get("false_computation")]
        if sel.is_tuple or sel.rank != 0 or sel.dtype != dt.PRED:
            raise ShapeError(f"conditional: predicate must be pred[], got {sel}")
    if not branches or any(b is None for b in branches):
        raise ShapeError("conditional: branch computations are missing")
    if len(shapes) - 1 != len(branches):
        raise ShapeError(f"conditional: {len(branches)} branches need {len(branches)} "
                         f"branch operands, got {len(shapes) - 1}")
    result = None
    for i, (comp, s) in enumerate(zip(branches, shapes[1:])):
        check_params("conditional", comp, [s], f"branch {i}")
        root = computation_root_shape("conditional", comp, f"branch {i}")
        if result is None:
            result = root
        elif not root.compatible(result):
            raise ShapeError(f"conditional: branch {i} %{comp.name} returns {root} but branch "
                             f"0 returns {result}")
    return result  # type: ignore[return-value]


@infer("call")
def infer_call(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    comp = attrs.get("to_apply")
    check_params("call", comp, shapes, "to_apply")
    return computation_root_shape("call", comp, "to_apply")


@infer("fusion")
def infer_fusion(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    comp = attrs.get("calls")
    check_params("fusion", comp, shapes, "fused")
    return computation_root_shape("fusion", comp, "fused")


@infer("custom-call")
def infer_custom_call(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    target = attrs.get("custom_call_target", "?")
    raise needs_shape("custom-call", f"target {target!r} defines its own result")


@infer("async-start")
def infer_async_start(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    raise needs_shape("async-start", "the async context shapes are backend-specific")


@result_check("async-start")
def check_async_start(shapes: list[AnyShape], attrs: dict[str, Any], result: AnyShape) -> None:
    # ((operands...), result, context...): the first two are checkable.
    if not result.is_tuple or len(result.elements) < 2:
        raise ShapeError(f"async-start: result must be ((operands), result, ...), got {result}")
    ops = result.elements[0]
    if not ops.compatible(TupleShape(tuple(shapes))):
        raise ShapeError(f"async-start: result element 0 {ops} must hold the operand shapes")
    comp = attrs.get("calls")
    if comp is not None and comp.root is not None:
        if not comp.root.shape.compatible(result.elements[1]):
            raise ShapeError(f"async-start: result element 1 {result.elements[1]} differs "
                             f"from the wrapped computation's result {comp.root.shape}")


@infer("async-update")
def infer_async_update(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("async-update", shapes, 1)
    return shapes[0].without_layout()


def _element(op: str, shapes: list[AnyShape], index: int) -> AnyShape:
    arity(op, shapes, 1)
    t = shapes[0]
    if not t.is_tuple or len(t.elements) <= index:
        raise ShapeError(f"{op}: operand must be a tuple with element {index}, got {t}")
    return t.elements[index].without_layout()


@infer("async-done")
def infer_async_done(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    return _element("async-done", shapes, 1)


# --- ids and random numbers -------------------------------------------------------------
@infer("replica-id", "partition-id")
def infer_device_id(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("replica-id", shapes, 0)
    return U32_SCALAR


@infer("rng-get-and-update-state")
def infer_rng_state(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("rng-get-and-update-state", shapes, 0)
    return Shape(dt.U64, (2,))


@infer("rng")
def infer_rng(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("rng", shapes, 2)
    a = array_operand("rng", shapes[0], "a")
    b = array_operand("rng", shapes[1], "b")
    if a.rank or b.rank or a.dtype != b.dtype:
        raise ShapeError(f"rng: parameters must be two scalars of one type, got {a} and {b}")
    raise needs_shape("rng", "the output dimensions")


@result_check("rng")
def check_rng(shapes: list[AnyShape], attrs: dict[str, Any], result: AnyShape) -> None:
    r = array_operand("rng", result, "result")
    if r.dtype != shapes[0].dtype:
        raise ShapeError(f"rng: result type {r.dtype} differs from the parameters' "
                         f"{shapes[0].dtype}")


@infer("rng-bit-generator")
def infer_rng_bit_generator(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("rng-bit-generator", shapes, 1)
    s = array_operand("rng-bit-generator", shapes[0], "state")
    if s.rank != 1 or not s.dtype.is_unsigned:
        raise ShapeError(f"rng-bit-generator: state must be an unsigned vector, got {s}")
    raise needs_shape("rng-bit-generator", "the size of the random output")


@result_check("rng-bit-generator")
def check_rng_bit_generator(shapes: list[AnyShape], attrs: dict[str, Any],
                            result: AnyShape) -> None:
    if not result.is_tuple or len(result.elements) != 2:
        raise ShapeError(f"rng-bit-generator: result must be (new_state, values), got {result}")
    if not result.elements[0].compatible(shapes[0]):
        raise ShapeError(f"rng-bit-generator: new state {result.elements[0]} must have the "
                         f"shape of the state operand {shapes[0]}")
    v = result.elements[1]
    if v.is_tuple or not (v.dtype.is_integer or v.dtype.is_float):
        raise ShapeError(f"rng-bit-generator: values must be an integer or float array, got {v}")


# --- host transfers ---------------------------------------------------------------------
def _token(op: str, s: AnyShape, what: str = "last operand") -> None:
    if not s.is_token:
        raise ShapeError(f"{op}: {what} must be a token, got {s}")


@infer("send")
def infer_send(shapes: list[AnyShape], attrs: dict[str, Any]) -> TupleShape:
    arity("send", shapes, 2)
    _token("send", shapes[1])
    return TupleShape((shapes[0].without_layout(), U32_SCALAR, Shape(dt.TOKEN, ())))


@infer("send-done", "outfeed")
def infer_token_result(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    if not shapes:
        raise ShapeError("send-done/outfeed: expects an operand")
    return Shape(dt.TOKEN, ())


@infer("recv")
def infer_recv(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("recv", shapes, 1)
    _token("recv", shapes[0])
    raise needs_shape("recv", "the received shape")


@infer("recv-done")
def infer_recv_done(shapes: list[AnyShape], attrs: dict[str, Any]) -> TupleShape:
    return TupleShape((_element("recv-done", shapes, 0), Shape(dt.TOKEN, ())))


@infer("infeed")
def infer_infeed(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("infeed", shapes, 1)
    _token("infeed", shapes[0])
    raise needs_shape("infeed", "the fed shape")


@result_check("infeed", "recv")
def check_infeed(shapes: list[AnyShape], attrs: dict[str, Any], result: AnyShape) -> None:
    # infeed: (data, token); recv: (data, u32[] context, token).
    if not result.is_tuple or not result.elements or not result.elements[-1].is_token:
        raise ShapeError(f"infeed/recv: result must be a tuple ending in a token, got {result}")

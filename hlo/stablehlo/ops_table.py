"""StableHLO op -> HLO instruction rules, registered in ``importer.OP_RULES``.

Each rule reads one MLIR op and emits HLO with XLA's attribute names (see hlo/attrs.py).
Result shapes always come from the MLIR result types, so no shape inference is needed.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from .. import dtypes as dt
from ..attrs import (ConvDimLabels, PaddingConfig, PadDim, Raw, ReplicaGroups, SliceDim,
                     SliceSpec, Window, WindowDim, quote)
from ..errors import HloImportError
from ..shape import Shape, TupleShape
from .importer import Importer, Scope, _is_constant, _string_value, free_values, op_rule
from .mlir_utils import LazyLocation, isa, attr_text, parse_dense, short_location, to_shape


# --- attribute readers ------------------------------------------------------------------
def has(op, name: str) -> bool:
    return name in op.attributes


def ints(op, name: str, default=None) -> tuple[int, ...] | None:
    if name not in op.attributes:
        return default
    a = op.attributes[name]
    try:
        return tuple(int(x) for x in a)
    except TypeError:
        return tuple(int(x) for x in re.findall(r"-?\d+", str(a).split(":")[0]))


def int_attr(op, name: str, default=None):
    from jaxlib.mlir import ir
    if name not in op.attributes:
        return default
    return ir.IntegerAttr(op.attributes[name]).value


def bool_attr(op, name: str, default: bool = False) -> bool:
    from jaxlib.mlir import ir
    if name not in op.attributes:
        return default
    a = op.attributes[name]
    if isa(a, ir.BoolAttr):
        return ir.BoolAttr(a).value
    return True  # unit attribute


def enum(op, name: str, default=None):
    if name not in op.attributes:
        return default
    return enum_text(str(op.attributes[name]))


def enum_text(text: str) -> str:
    m = re.search(r"(\w+)\s*>\s*$", text)
    if not m:
        raise HloImportError(f"cannot read enum attribute {text!r}")
    return m.group(1)


def result_shape(op, i: int = 0):
    return to_shape(op.results[i].type, LazyLocation(op.location))  # type: ignore[arg-type]


def results_shape(op):
    """One shape for all results: the single one, or a tuple (XLA's multi-output form)."""
    where = LazyLocation(op.location)
    shapes = [to_shape(r.type, where) for r in op.results]  # type: ignore[arg-type]
    return shapes[0] if len(shapes) == 1 else TupleShape(tuple(shapes))


def where(op) -> str:
    return short_location(op.location)


# --- elementwise and simple one-to-one ops -----------------------------------------------
_SIMPLE = {
    "abs": "abs", "add": "add", "and": "and", "atan2": "atan2", "cbrt": "cbrt", "ceil": "ceil",
    "count_leading_zeros": "count-leading-zeros", "complex": "complex", "cosine": "cosine",
    "divide": "divide", "exponential": "exponential",
    "exponential_minus_one": "exponential-minus-one", "floor": "floor", "imag": "imag",
    "is_finite": "is-finite", "log": "log", "log_plus_one": "log-plus-one",
    "logistic": "logistic", "maximum": "maximum", "minimum": "minimum", "multiply": "multiply",
    "negate": "negate", "not": "not", "or": "or", "popcnt": "popcnt", "power": "power",
    "real": "real", "remainder": "remainder", "round_nearest_afz": "round-nearest-afz",
    "round_nearest_even": "round-nearest-even", "rsqrt": "rsqrt", "select": "select",
    "shift_left": "shift-left", "shift_right_arithmetic": "shift-right-arithmetic",
    "shift_right_logical": "shift-right-logical", "sign": "sign", "sine": "sine",
    "sqrt": "sqrt", "subtract": "subtract", "tan": "tan", "tanh": "tanh", "xor": "xor",
    "clamp": "clamp", "convert": "convert", "bitcast_convert": "bitcast-convert",
    "reshape": "reshape", "dynamic_slice": None, "dynamic_update_slice": "dynamic-update-slice",
    "tuple": "tuple", "after_all": "after-all", "create_token": "after-all",
    "replica_id": "replica-id", "partition_id": "partition-id",
}
_SIMPLE.pop("dynamic_slice")


def _simple(hlo_opcode: str):
    def rule(imp: Importer, scope: Scope, op: Any):
        attrs = {}
        if "result_accuracy" in op.attributes:
            text = str(op.attributes["result_accuracy"])
            if "DEFAULT" not in text:
                attrs["result_accuracy"] = Raw(text)
        return imp.emit(scope, hlo_opcode, imp.operands(scope, op), results_shape(op), attrs, op)
    return rule


for _name, _hlo in _SIMPLE.items():
    op_rule("stablehlo." + _name)(_simple(_hlo))


@op_rule("stablehlo.constant")
def _constant(imp, scope, op):
    shape = result_shape(op)
    lit = parse_dense(attr_text(op, "value"), shape, where(op))
    return imp.emit(scope, "constant", [], shape, op=op, literal=lit)


@op_rule("stablehlo.iota")
def _iota(imp, scope, op):
    return imp.emit(scope, "iota", [], result_shape(op),
                    {"iota_dimension": int_attr(op, "iota_dimension")}, op)


@op_rule("stablehlo.broadcast_in_dim")
def _broadcast_in_dim(imp, scope, op):
    (x,) = imp.operands(scope, op)
    return _degenerate_broadcast(imp, scope, op, x, result_shape(op),
                                 ints(op, "broadcast_dimensions"))


def _degenerate_broadcast(imp, scope, op, x, out, dims):
    """StableHLO lets a size-1 operand dim stretch; HLO's broadcast does not, so (as XLA
    does) reshape those dims away first."""
    keep = [i for i, d in enumerate(dims) if not (x.shape.dims[i] == 1 and out.dims[d] != 1)]
    if len(keep) != len(dims):
        kept_dims = tuple(x.shape.dims[i] for i in keep)
        x = imp.emit(scope, "reshape", [x], Shape(x.shape.dtype, kept_dims,
                                                  _row_major(len(kept_dims))), op=op)
        dims = tuple(dims[i] for i in keep)
    return imp.emit(scope, "broadcast", [x], out, {"dimensions": tuple(dims)}, op)


def _row_major(rank):
    from ..shape import Layout
    return Layout.row_major(rank)


@op_rule("stablehlo.broadcast")
def _broadcast(imp, scope, op):
    # stablehlo.broadcast prepends broadcast_sizes: the operand maps to the trailing dims.
    shape = result_shape(op)
    n_new = len(ints(op, "broadcast_sizes"))
    return imp.emit(scope, "broadcast", imp.operands(scope, op), shape,
                    {"dimensions": tuple(range(n_new, shape.rank))}, op)


@op_rule("stablehlo.transpose")
def _transpose(imp, scope, op):
    return imp.emit(scope, "transpose", imp.operands(scope, op), result_shape(op),
                    {"dimensions": ints(op, "permutation")}, op)


@op_rule("stablehlo.reverse")
def _reverse(imp, scope, op):
    return imp.emit(scope, "reverse", imp.operands(scope, op), result_shape(op),
                    {"dimensions": ints(op, "dimensions")}, op)


@op_rule("stablehlo.slice")
def _slice(imp, scope, op):
    starts, limits = ints(op, "start_indices"), ints(op, "limit_indices")
    strides = ints(op, "strides", (1,) * len(starts))
    spec = SliceSpec(tuple(SliceDim(a, b, c) for a, b, c in zip(starts, limits, strides)))
    return imp.emit(scope, "slice", imp.operands(scope, op), result_shape(op), {"slice": spec}, op)


@op_rule("stablehlo.dynamic_slice")
def _dynamic_slice(imp, scope, op):
    return imp.emit(scope, "dynamic-slice", imp.operands(scope, op), result_shape(op),
                    {"dynamic_slice_sizes": ints(op, "slice_sizes")}, op)


@op_rule("stablehlo.concatenate")
def _concatenate(imp, scope, op):
    return imp.emit(scope, "concatenate", imp.operands(scope, op), result_shape(op),
                    {"dimensions": (int_attr(op, "dimension"),)}, op)


@op_rule("stablehlo.pad")
def _pad(imp, scope, op):
    lo, hi, inner = ints(op, "edge_padding_low"), ints(op, "edge_padding_high"), \
        ints(op, "interior_padding")
    cfg = PaddingConfig(tuple(PadDim(a, b, c) for a, b, c in zip(lo, hi, inner)))
    return imp.emit(scope, "pad", imp.operands(scope, op), result_shape(op), {"padding": cfg}, op)


@op_rule("stablehlo.reduce_precision")
def _reduce_precision(imp, scope, op):
    return imp.emit(scope, "reduce-precision", imp.operands(scope, op), result_shape(op),
                    {"exponent_bits": int_attr(op, "exponent_bits"),
                     "mantissa_bits": int_attr(op, "mantissa_bits")}, op)


@op_rule("stablehlo.compare")
def _compare(imp, scope, op):
    attrs = {"direction": enum(op, "comparison_direction")}
    ctype = enum(op, "compare_type")
    if ctype is not None and ctype != "NOTYPE":
        attrs["type"] = ctype
    return imp.emit(scope, "compare", imp.operands(scope, op), result_shape(op), attrs, op)


@op_rule("stablehlo.get_tuple_element")
def _gte(imp, scope, op):
    return imp.emit(scope, "get-tuple-element", imp.operands(scope, op), result_shape(op),
                    {"index": int_attr(op, "index")}, op)


@op_rule("stablehlo.get_dimension_size")
def _get_dimension_size(imp, scope, op):
    return imp.emit(scope, "get-dimension-size", imp.operands(scope, op), result_shape(op),
                    {"dimensions": (int_attr(op, "dimension"),)}, op)


@op_rule("stablehlo.optimization_barrier")
def _opt_barrier(imp, scope, op):
    # HLO's optimization-barrier takes (and returns) one tuple.
    ins = imp.operands(scope, op)
    t = imp.emit(scope, "tuple", ins, TupleShape(tuple(i.shape for i in ins)))
    return_shape = TupleShape(tuple(i.shape for i in ins))
    bar = imp.emit(scope, "optimization-barrier", [t], return_shape, op=op)
    if len(ins) == 1:
        return [imp.emit(scope, "get-tuple-element", [bar], ins[0].shape, {"index": 0})]
    return bar


# --- dot / convolution -------------------------------------------------------------------
def _precision(op, attrs: dict) -> None:
    if "precision_config" not in op.attributes:
        return
    names = tuple(enum_text(str(a)).lower() for a in op.attributes["precision_config"])
    if names and any(n != "default" for n in names):
        attrs["operand_precision"] = names


def _algorithm(op, attrs: dict) -> None:
    if "algorithm" not in op.attributes:
        return
    from jaxlib.mlir.dialects import stablehlo as sh
    a = sh.DotAlgorithm(op.attributes["algorithm"])
    lhs, rhs, acc = (dt.from_mlir(str(t)).name if str(t) in dt.BY_MLIR else str(t).lower()
                     for t in (a.lhs_precision_type, a.rhs_precision_type, a.accumulation_type))
    name = f"dot_{lhs}_{rhs}_{acc}"
    if a.num_primitive_operations > 1:
        name += f"_x{a.num_primitive_operations}"
    attrs["algorithm"] = name


@op_rule("stablehlo.dot_general")
def _dot_general(imp, scope, op):
    from jaxlib.mlir.dialects import stablehlo as sh
    d = sh.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    attrs: dict = {}
    if list(d.lhs_batching_dimensions):
        attrs["lhs_batch_dims"] = tuple(d.lhs_batching_dimensions)
    attrs["lhs_contracting_dims"] = tuple(d.lhs_contracting_dimensions)
    if list(d.rhs_batching_dimensions):
        attrs["rhs_batch_dims"] = tuple(d.rhs_batching_dimensions)
    attrs["rhs_contracting_dims"] = tuple(d.rhs_contracting_dimensions)
    _precision(op, attrs)
    _algorithm(op, attrs)
    return imp.emit(scope, "dot", imp.operands(scope, op), result_shape(op), attrs, op)


@op_rule("stablehlo.dot")
def _dot(imp, scope, op):
    lhs, rhs = imp.operands(scope, op)
    attrs = {"lhs_contracting_dims": (lhs.shape.rank - 1,),
             "rhs_contracting_dims": (0,)}
    _precision(op, attrs)
    return imp.emit(scope, "dot", [lhs, rhs], result_shape(op), attrs, op)


def _pairs(op, name: str, n: int) -> list[tuple[int, int]]:
    flat = ints(op, name, (0,) * (2 * n))
    return [(flat[2 * i], flat[2 * i + 1]) for i in range(n)]


@op_rule("stablehlo.convolution")
def _convolution(imp, scope, op, pads=None):
    from jaxlib.mlir.dialects import stablehlo as sh
    lhs, rhs = imp.operands(scope, op)[:2]
    d = sh.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    labels = ConvDimLabels(d.input_batch_dimension, d.input_feature_dimension,
                           tuple(d.input_spatial_dimensions), d.kernel_input_feature_dimension,
                           d.kernel_output_feature_dimension, tuple(d.kernel_spatial_dimensions),
                           d.output_batch_dimension, d.output_feature_dimension,
                           tuple(d.output_spatial_dimensions))
    n = len(labels.kernel_spatial)
    sizes = [rhs.shape.dims[k] for k in labels.kernel_spatial]
    strides = ints(op, "window_strides", (1,) * n)
    pads = _pairs(op, "padding", n) if pads is None else pads
    lhs_dil = ints(op, "lhs_dilation", (1,) * n)
    rhs_dil = ints(op, "rhs_dilation", (1,) * n)
    rev = tuple(bool(x) for x in op.attributes["window_reversal"]) \
        if has(op, "window_reversal") else (False,) * n
    window = Window(tuple(WindowDim(sizes[i], strides[i], pads[i][0], pads[i][1], rhs_dil[i],
                                    lhs_dil[i], rev[i]) for i in range(n)))
    attrs: dict = {"window": window, "dim_labels": labels}
    fgc, bgc = int_attr(op, "feature_group_count", 1), int_attr(op, "batch_group_count", 1)
    if fgc != 1:
        attrs["feature_group_count"] = fgc
    if bgc != 1:
        attrs["batch_group_count"] = bgc
    _precision(op, attrs)
    return imp.emit(scope, "convolution", [lhs, rhs], result_shape(op), attrs, op)


# --- reductions, windows, sort -----------------------------------------------------------
def _check_isolated(op, regions) -> None:
    from .importer import _is_constant
    if [v for v in free_values(regions) if not _is_constant(v)]:
        raise HloImportError("regions that capture outer values are only supported in "
                             "while/case/if", op=op.operation.name, location=where(op))


def _region(imp, op, idx: int, base: str):
    region = op.regions[idx]
    _check_isolated(op, [region])
    return imp.region_computation(region, base)


@op_rule("stablehlo.reduce")
def _reduce(imp, scope, op):
    comp = _region(imp, op, 0, "region")
    return imp.emit(scope, "reduce", imp.operands(scope, op), results_shape(op),
                    {"dimensions": ints(op, "dimensions"), "to_apply": comp}, op)


def _window(op, rank: int, size_key: str = "window_dimensions") -> Window:
    sizes = ints(op, size_key)
    strides = ints(op, "window_strides", (1,) * rank)
    base = ints(op, "base_dilations", (1,) * rank)
    wdil = ints(op, "window_dilations", (1,) * rank)
    pads = _pairs(op, "padding", rank)
    return Window(tuple(WindowDim(sizes[i], strides[i], pads[i][0], pads[i][1], wdil[i], base[i])
                        for i in range(rank)))


@op_rule("stablehlo.reduce_window")
def _reduce_window(imp, scope, op):
    ins = imp.operands(scope, op)
    comp = _region(imp, op, 0, "region")
    window = _window(op, ins[0].shape.rank)
    return imp.emit(scope, "reduce-window", ins, results_shape(op),
                    {"window": window, "to_apply": comp}, op)


@op_rule("stablehlo.select_and_scatter")
def _select_and_scatter(imp, scope, op):
    ins = imp.operands(scope, op)
    sel = _region(imp, op, 0, "region")
    sca = _region(imp, op, 1, "region")
    window = _window(op, ins[0].shape.rank)
    return imp.emit(scope, "select-and-scatter", ins, result_shape(op),
                    {"window": window, "select": sel, "scatter": sca}, op)


@op_rule("stablehlo.sort")
def _sort(imp, scope, op):
    comp = _region(imp, op, 0, "region")
    attrs = {"dimensions": (int_attr(op, "dimension", -1),)}
    if attrs["dimensions"][0] < 0:
        attrs["dimensions"] = (attrs["dimensions"][0] + result_shape(op).rank,)
    if bool_attr(op, "is_stable"):
        attrs["is_stable"] = True
    attrs["to_apply"] = comp
    return imp.emit(scope, "sort", imp.operands(scope, op), results_shape(op), attrs, op)


@op_rule("stablehlo.map")
def _map(imp, scope, op):
    comp = _region(imp, op, 0, "region")
    return imp.emit(scope, "map", imp.operands(scope, op), result_shape(op),
                    {"dimensions": ints(op, "dimensions"), "to_apply": comp}, op)


# --- gather / scatter --------------------------------------------------------------------
@op_rule("stablehlo.gather")
def _gather(imp, scope, op, operands=None, slice_sizes=None):
    from jaxlib.mlir.dialects import stablehlo as sh
    d = sh.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    attrs = {"offset_dims": tuple(d.offset_dims),
             "collapsed_slice_dims": tuple(d.collapsed_slice_dims),
             "start_index_map": tuple(d.start_index_map)}
    if list(d.operand_batching_dims):
        attrs["operand_batching_dims"] = tuple(d.operand_batching_dims)
        attrs["start_indices_batching_dims"] = tuple(d.start_indices_batching_dims)
    attrs["index_vector_dim"] = d.index_vector_dim
    attrs["slice_sizes"] = ints(op, "slice_sizes") if slice_sizes is None else slice_sizes
    if bool_attr(op, "indices_are_sorted"):
        attrs["indices_are_sorted"] = True
    return imp.emit(scope, "gather", operands or imp.operands(scope, op), result_shape(op),
                    attrs, op)


@op_rule("stablehlo.scatter")
def _scatter(imp, scope, op):
    from jaxlib.mlir.dialects import stablehlo as sh
    d = sh.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    comp = _region(imp, op, 0, "region")
    attrs = {"update_window_dims": tuple(d.update_window_dims),
             "inserted_window_dims": tuple(d.inserted_window_dims),
             "scatter_dims_to_operand_dims": tuple(d.scattered_dims_to_operand_dims)}
    if list(d.input_batching_dims):
        attrs["input_batching_dims"] = tuple(d.input_batching_dims)
        attrs["scatter_indices_batching_dims"] = tuple(d.scatter_indices_batching_dims)
    attrs["index_vector_dim"] = d.index_vector_dim
    if bool_attr(op, "indices_are_sorted"):
        attrs["indices_are_sorted"] = True
    if bool_attr(op, "unique_indices"):
        attrs["unique_indices"] = True
    attrs["to_apply"] = comp
    return imp.emit(scope, "scatter", imp.operands(scope, op), results_shape(op), attrs, op)


# --- control flow ------------------------------------------------------------------------
@op_rule("stablehlo.while")
def _while(imp, scope, op):
    # XLA's while has one operand: the loop state. Several carried values and the values the
    # regions capture from outside become one tuple; results read it back with GTEs.
    ins = imp.operands(scope, op)
    caps = [c for c in free_values([op.regions[0], op.regions[1]]) if not _is_constant(c)]
    cap_insts = [imp.get(scope, c) for c in caps]
    state = ins + cap_insts
    cond = imp.region_computation(op.regions[0], "region", tuple_params=True, captures=caps)
    body = imp.region_computation(op.regions[1], "region", tuple_params=True, captures=caps,
                                  extra_results=True)
    init = imp.tuple_or_single(scope, state)
    w = imp.emit(scope, "while", [init], init.shape, {"condition": cond, "body": body}, op)
    if len(state) == 1:
        return [w]
    return [imp.emit(scope, "get-tuple-element", [w], w.shape.elements[i], {"index": i})
            for i in range(len(ins))] if caps else w


def _branches(imp, scope, op, base: str):
    comps, operands = [], []
    for r in op.regions:
        caps = [c for c in free_values([r]) if not _is_constant(c)]
        insts = [imp.get(scope, c) for c in caps]
        operands.append(imp.emit(scope, "tuple", insts, TupleShape(tuple(i.shape for i in insts))))
        # Each branch takes one tuple operand holding what it captures (empty if nothing).
        comps.append(imp.region_computation(r, base, tuple_params=True, captures=caps,
                                            force_tuple=True))
    return comps, operands


def _cond_result(imp, scope, op, inst):
    if len(op.results) == 0:
        return None
    return inst


@op_rule("stablehlo.case")
def _case(imp, scope, op):
    index = imp.operands(scope, op)[0]
    comps, operands = _branches(imp, scope, op, "region")
    shape = results_shape(op) if len(op.results) else TupleShape(())
    inst = imp.emit(scope, "conditional", [index] + operands, shape,
                    {"branch_computations": tuple(comps)}, op)
    return _cond_result(imp, scope, op, inst)


@op_rule("stablehlo.if")
def _if(imp, scope, op):
    pred = imp.operands(scope, op)[0]
    comps, operands = _branches(imp, scope, op, "region")
    shape = results_shape(op) if len(op.results) else TupleShape(())
    inst = imp.emit(scope, "conditional", [pred] + operands, shape,
                    {"true_computation": comps[0], "false_computation": comps[1]}, op)
    return _cond_result(imp, scope, op, inst)


def _call(imp, scope, op, sym: str):
    comp = imp.func_computation(sym)
    shape = results_shape(op) if len(op.results) else TupleShape(())
    inst = imp.emit(scope, "call", imp.operands(scope, op), shape, {"to_apply": comp}, op)
    return inst if len(op.results) else None


def _symbol(attr) -> str:
    return str(attr).lstrip("@").strip('"')


@op_rule("func.call")
def _func_call(imp, scope, op):
    return _call(imp, scope, op, _symbol(op.attributes["callee"]))


@op_rule("stablehlo.composite")
def _composite(imp, scope, op):
    return _call(imp, scope, op, _symbol(op.attributes["decomposition"]))


# --- custom call ---------------------------------------------------------------------------
_API_VERSIONS = {1: "API_VERSION_ORIGINAL", 2: "API_VERSION_STATUS_RETURNING",
                 3: "API_VERSION_STATUS_RETURNING_UNIFIED", 4: "API_VERSION_TYPED_FFI"}


@op_rule("stablehlo.custom_call")
def _custom_call(imp, scope, op):
    from jaxlib.mlir import ir
    target = _string_value(op.attributes["call_target_name"])
    attrs: dict = {"custom_call_target": target}
    if has(op, "backend_config"):
        a = op.attributes["backend_config"]
        if isa(a, ir.StringAttr):
            s = ir.StringAttr(a).value
            if s:
                attrs["backend_config"] = Raw(quote(s))
        else:
            attrs["backend_config"] = Raw(str(a))
    elif has(op, "mhlo.backend_config"):
        attrs["backend_config"] = Raw(str(op.attributes["mhlo.backend_config"]))
    version = int_attr(op, "api_version", 1)
    if version != 1:
        attrs["api_version"] = _API_VERSIONS.get(version, f"API_VERSION_{version}")
    if bool_attr(op, "has_side_effect"):
        attrs["custom_call_has_side_effect"] = True
    if has(op, "output_operand_aliases") and len(op.attributes["output_operand_aliases"]):
        attrs["output_to_operand_aliasing"] = Raw(str(op.attributes["output_operand_aliases"]))
    if has(op, "called_computations") and len(op.attributes["called_computations"]):
        # Each named function becomes a computation the custom-call keeps (XLA's
        # ``called_computations={...}``); the target decides how to call them.
        attrs["called_computations"] = tuple(
            imp.func_computation(_symbol(a)) for a in op.attributes["called_computations"])
    shape = results_shape(op) if len(op.results) else TupleShape(())
    inst = imp.emit(scope, "custom-call", imp.operands(scope, op), shape, attrs, op)
    return inst if len(op.results) else None


# --- rng, fft, linalg, batch norm ------------------------------------------------------
_RNG_ALGOS = {"DEFAULT": "rng_default", "THREE_FRY": "rng_three_fry", "PHILOX": "rng_philox"}


@op_rule("stablehlo.rng_bit_generator")
def _rng_bit_generator(imp, scope, op):
    algo = _RNG_ALGOS[enum(op, "rng_algorithm", "DEFAULT")]
    return imp.emit(scope, "rng-bit-generator", imp.operands(scope, op), results_shape(op),
                    {"algorithm": algo}, op)


@op_rule("stablehlo.rng")
def _rng(imp, scope, op):
    a, b, _shape = imp.operands(scope, op)
    dist = {"UNIFORM": "rng_uniform", "NORMAL": "rng_normal"}[enum(op, "rng_distribution")]
    return imp.emit(scope, "rng", [a, b], result_shape(op), {"distribution": dist}, op)


@op_rule("stablehlo.fft")
def _fft(imp, scope, op):
    return imp.emit(scope, "fft", imp.operands(scope, op), result_shape(op),
                    {"fft_type": enum(op, "fft_type"), "fft_length": ints(op, "fft_length")}, op)


@op_rule("stablehlo.cholesky")
def _cholesky(imp, scope, op):
    return imp.emit(scope, "cholesky", imp.operands(scope, op), result_shape(op),
                    {"lower": bool_attr(op, "lower")}, op)


@op_rule("stablehlo.triangular_solve")
def _triangular_solve(imp, scope, op):
    attrs = {"left_side": bool_attr(op, "left_side"), "lower": bool_attr(op, "lower"),
             "unit_diagonal": bool_attr(op, "unit_diagonal"),
             "transpose_a": enum(op, "transpose_a", "NO_TRANSPOSE")}
    return imp.emit(scope, "triangular-solve", imp.operands(scope, op), result_shape(op),
                    attrs, op)


def _bn_attrs(op) -> dict:
    from jaxlib.mlir import ir
    return {"epsilon": ir.FloatAttr(op.attributes["epsilon"]).value,
            "feature_index": int_attr(op, "feature_index")}


for _n, _h in (("batch_norm_training", "batch-norm-training"),
               ("batch_norm_inference", "batch-norm-inference"),
               ("batch_norm_grad", "batch-norm-grad")):
    def _mk(h):
        def rule(imp, scope, op):
            return imp.emit(scope, h, imp.operands(scope, op), results_shape(op), _bn_attrs(op), op)
        return rule
    op_rule("stablehlo." + _n)(_mk(_h))


# --- tokens, host transfers ------------------------------------------------------------
@op_rule("stablehlo.outfeed")
def _outfeed(imp, scope, op):
    ins = imp.operands(scope, op)
    data, token = ins[:-1], ins[-1]
    t = imp.emit(scope, "tuple", data, TupleShape(tuple(i.shape for i in data)))
    attrs = {}
    cfg = _string_value(op.attributes["outfeed_config"]) if has(op, "outfeed_config") else ""
    if cfg:
        attrs["outfeed_config"] = cfg
    return imp.emit(scope, "outfeed", [t, token], result_shape(op), attrs, op)


@op_rule("stablehlo.infeed")
def _infeed(imp, scope, op):
    (token,) = imp.operands(scope, op)
    shapes = [to_shape(r.type) for r in op.results]
    data_shape = TupleShape(tuple(shapes[:-1]))
    attrs = {}
    cfg = _string_value(op.attributes["infeed_config"]) if has(op, "infeed_config") else ""
    if cfg:
        attrs["infeed_config"] = cfg
    inf = imp.emit(scope, "infeed", [token], TupleShape((data_shape, shapes[-1])), attrs, op)
    data = imp.emit(scope, "get-tuple-element", [inf], data_shape, {"index": 0})
    outs = [imp.emit(scope, "get-tuple-element", [data], s, {"index": i})
            for i, s in enumerate(shapes[:-1])]
    outs.append(imp.emit(scope, "get-tuple-element", [inf], shapes[-1], {"index": 1}))
    return outs


# --- collectives -------------------------------------------------------------------------
def _replica_groups(op) -> ReplicaGroups:
    if not has(op, "replica_groups"):
        return ReplicaGroups(())
    shape = to_shape(op.attributes["replica_groups"].type)
    flat = ints(op, "replica_groups")
    width = shape.dims[1] if shape.rank == 2 else len(flat)
    groups = [flat[i:i + width] for i in range(0, len(flat), width)] if width else []
    return ReplicaGroups(tuple(tuple(x for x in g if x >= 0) for g in groups))


def _collective_attrs(op) -> dict:
    attrs: dict = {}
    if has(op, "channel_handle"):
        from jaxlib.mlir.dialects import stablehlo as sh
        h = sh.ChannelHandle(op.attributes["channel_handle"]).handle
        if h > 0:
            attrs["channel_id"] = h
    attrs["replica_groups"] = _replica_groups(op)
    if bool_attr(op, "use_global_device_ids"):
        attrs["use_global_device_ids"] = True
    return attrs


@op_rule("stablehlo.all_reduce")
def _all_reduce(imp, scope, op):
    attrs = _collective_attrs(op)
    attrs["to_apply"] = _region(imp, op, 0, "region")
    return imp.emit(scope, "all-reduce", imp.operands(scope, op), results_shape(op), attrs, op)


@op_rule("stablehlo.all_gather")
def _all_gather(imp, scope, op):
    attrs = _collective_attrs(op)
    attrs["dimensions"] = (int_attr(op, "all_gather_dim"),)
    return imp.emit(scope, "all-gather", imp.operands(scope, op), results_shape(op), attrs, op)


@op_rule("stablehlo.reduce_scatter")
def _reduce_scatter(imp, scope, op):
    attrs = _collective_attrs(op)
    attrs["dimensions"] = (int_attr(op, "scatter_dimension"),)
    attrs["to_apply"] = _region(imp, op, 0, "region")
    return imp.emit(scope, "reduce-scatter", imp.operands(scope, op), results_shape(op), attrs, op)


@op_rule("stablehlo.all_to_all")
def _all_to_all(imp, scope, op):
    split, concat = int_attr(op, "split_dimension"), int_attr(op, "concat_dimension")
    count = int_attr(op, "split_count")
    attrs = _collective_attrs(op)
    ins = imp.operands(scope, op)
    if split == concat:
        attrs["dimensions"] = (split,)
        return imp.emit(scope, "all-to-all", ins, results_shape(op), attrs, op)
    # HLO's array all-to-all splits and concatenates along one dimension. As XLA's
    # decomposer does: split dim `split` into (count, rest), move `count` to the front,
    # exchange along dim 0, then move it before dim `concat` and merge it into that dim.
    staged = []
    for x in ins:
        dims, dtype = list(x.shape.dims), x.shape.dtype
        if dims[split] % count:
            raise HloImportError(f"all_to_all: dimension {split} of size {dims[split]} does "
                                 f"not split into {count}", op=op.operation.name,
                                 location=where(op))
        piece = dims[:split] + [dims[split] // count] + dims[split + 1:]
        y = imp.emit(scope, "reshape", [x], _shape(dtype, dims[:split] + [count, dims[split] //
                                                                       count] + dims[split + 1:]),
                     op=op)
        perm = [split] + [i for i in range(len(dims) + 1) if i != split]
        staged.append((imp.emit(scope, "transpose", [y], _shape(dtype, [count] + piece),
                                {"dimensions": tuple(perm)}, op), piece, dtype))
    shapes = [z.shape for z, _, _ in staged]
    attrs["dimensions"] = (0,)
    a2a = imp.emit(scope, "all-to-all", [z for z, _, _ in staged],
                   shapes[0] if len(shapes) == 1 else TupleShape(tuple(shapes)), attrs, op)
    outs = []
    for i, (z, piece, dtype) in enumerate(staged):
        w = a2a if len(staged) == 1 else imp.emit(scope, "get-tuple-element", [a2a], shapes[i],
                                                  {"index": i})
        moved = piece[:concat] + [count] + piece[concat:]
        perm = list(range(1, concat + 1)) + [0] + list(range(concat + 1, len(piece) + 1))
        t = imp.emit(scope, "transpose", [w], _shape(dtype, moved), {"dimensions": tuple(perm)},
                     op)
        outs.append(imp.emit(scope, "reshape", [t], result_shape(op, i), op=op))
    return outs if len(outs) > 1 else outs[0]


def _shape(dtype, dims) -> Shape:
    return Shape(dtype, tuple(dims), _row_major(len(dims)))


@op_rule("stablehlo.collective_permute")
def _collective_permute(imp, scope, op):
    flat = ints(op, "source_target_pairs")
    attrs: dict = {}
    if has(op, "channel_handle"):
        from jaxlib.mlir.dialects import stablehlo as sh
        h = sh.ChannelHandle(op.attributes["channel_handle"]).handle
        if h > 0:
            attrs["channel_id"] = h
    attrs["source_target_pairs"] = tuple((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))
    return imp.emit(scope, "collective-permute", imp.operands(scope, op), result_shape(op),
                    attrs, op)


@op_rule("stablehlo.collective_broadcast")
def _collective_broadcast(imp, scope, op):
    return imp.emit(scope, "collective-broadcast", imp.operands(scope, op), result_shape(op),
                    _collective_attrs(op), op)


# --- explicitly unsupported ----------------------------------------------------------------
def _unsupported(reason: str):
    def rule(imp, scope, op):
        raise HloImportError(reason, op=op.operation.name, location=where(op))
    return rule


# Dynamic ops whose result type is static are the static ops with extra shape operands
# (XLA legalizes them the same way); a dynamic result type fails in ``result_shape``.
@op_rule("stablehlo.dynamic_iota")
def _dynamic_iota(imp, scope, op):
    return imp.emit(scope, "iota", [], result_shape(op),
                    {"iota_dimension": int_attr(op, "iota_dimension")}, op)


@op_rule("stablehlo.dynamic_reshape")
def _dynamic_reshape(imp, scope, op):
    return imp.emit(scope, "reshape", [imp.get(scope, op.operands[0])], result_shape(op), op=op)


@op_rule("stablehlo.dynamic_broadcast_in_dim")
def _dynamic_broadcast_in_dim(imp, scope, op):
    return _degenerate_broadcast(imp, scope, op, imp.get(scope, op.operands[0]),
                                 result_shape(op), ints(op, "broadcast_dimensions"))


# Dynamic ops whose shape operands are constants are their static ops (XLA's
# canonicalization folds them the same way); other shape operands mean a dynamic shape.
def _constant_operand(imp, scope, op, idx: int, what: str) -> np.ndarray:
    inst = imp.get(scope, op.operands[idx])
    if inst.opcode != "constant" or inst.literal is None:
        raise HloImportError(f"{what} must be a constant (dynamic shapes are not supported)",
                             op=op.operation.name, location=where(op))
    return np.asarray(inst.literal)


@op_rule("stablehlo.dynamic_conv")
def _dynamic_conv(imp, scope, op):
    pad = _constant_operand(imp, scope, op, 2, "the padding operand")
    return _convolution(imp, scope, op, pads=[(int(a), int(b)) for a, b in pad.reshape(-1, 2)])


@op_rule("stablehlo.dynamic_gather")
def _dynamic_gather(imp, scope, op):
    sizes = _constant_operand(imp, scope, op, 2, "slice_sizes")
    ins = imp.operands(scope, op)
    return _gather(imp, scope, op, operands=ins[:2],
                   slice_sizes=tuple(int(v) for v in sizes.reshape(-1)))


@op_rule("stablehlo.dynamic_pad")
def _dynamic_pad(imp, scope, op):
    lo, hi, inner = (_constant_operand(imp, scope, op, k, n).reshape(-1)
                     for k, n in ((2, "edge_padding_low"), (3, "edge_padding_high"),
                                  (4, "interior_padding")))
    cfg = PaddingConfig(tuple(PadDim(int(a), int(b), int(c)) for a, b, c in zip(lo, hi, inner)))
    ins = imp.operands(scope, op)
    return imp.emit(scope, "pad", ins[:2], result_shape(op), {"padding": cfg}, op)


for _n in ("real_dynamic_slice", "set_dimension_size"):
    op_rule("stablehlo." + _n)(_unsupported("dynamic shapes are not supported"))
for _n in ("uniform_quantize", "uniform_dequantize"):
    op_rule("stablehlo." + _n)(_unsupported("quantized types are not supported"))

# --- send / recv ---------------------------------------------------------------------------
def _p2p_attrs(op) -> dict:
    from jaxlib.mlir.dialects import stablehlo as sh
    attrs: dict = {"channel_id": sh.ChannelHandle(op.attributes["channel_handle"]).handle}
    if bool_attr(op, "is_host_transfer"):
        attrs["is_host_transfer"] = True
    return attrs


@op_rule("stablehlo.send")
def _send(imp, scope, op):
    # XLA's pair: send(data, token) -> (data, u32[] context, token); send-done -> token.
    # Several inputs travel as one tuple.
    ins = imp.operands(scope, op)
    data, token = ins[:-1], ins[-1]
    payload = data[0] if len(data) == 1 else imp.emit(
        scope, "tuple", data, TupleShape(tuple(d.shape for d in data)))
    attrs = _p2p_attrs(op)
    tok = Shape(dt.TOKEN, ())
    send = imp.emit(scope, "send", [payload, token],
                    TupleShape((payload.shape, Shape(dt.U32, ()), tok)), attrs, op)
    return imp.emit(scope, "send-done", [send], tok, attrs, op)


@op_rule("stablehlo.recv")
def _recv(imp, scope, op):
    (token,) = imp.operands(scope, op)
    shapes = [to_shape(r.type, where(op)) for r in op.results]
    data_shapes, tok = shapes[:-1], shapes[-1]
    payload = data_shapes[0] if len(data_shapes) == 1 else TupleShape(tuple(data_shapes))
    attrs = _p2p_attrs(op)
    recv = imp.emit(scope, "recv", [token], TupleShape((payload, Shape(dt.U32, ()), tok)),
                    attrs, op)
    done = imp.emit(scope, "recv-done", [recv], TupleShape((payload, tok)), attrs, op)
    data = imp.emit(scope, "get-tuple-element", [done], payload, {"index": 0})
    outs = [data] if len(data_shapes) == 1 else [
        imp.emit(scope, "get-tuple-element", [data], s, {"index": i})
        for i, s in enumerate(data_shapes)]
    return outs + [imp.emit(scope, "get-tuple-element", [done], tok, {"index": 1})]

"""The op table: one entry per HLO opcode.

Each ``OpDef`` names the opcode as XLA prints it, its category (used by drawing and by
fusion), how many operands it takes, and the rules attached to it by topic modules:
``infer`` (shape inference, ``hlo/shape_inference.py``), ``verify`` (extra checks beyond
"inferred shape == declared shape", ``hlo/verifier.py``) and ``evaluate`` (the reference
interpreter, ``hlo/evaluator/``). Adding an op is one line here plus its rules, each
registered with ``@rule("infer", "opcode", ...)``-style decorators next to its peers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from .errors import HlotkError

# Categories, as drawn and as fusion sees them.
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
DOT_CONV = "dot/conv"
DATA_MOVEMENT = "data movement"
CONTROL_FLOW = "control flow"
COLLECTIVE = "collective"
PARAM_CONST = "parameter/constant"
OTHER = "other"

VARIADIC = -1


@dataclass
class OpDef:
    name: str
    category: str
    arity: int = VARIADIC                 # VARIADIC: any number (checked by ``infer``)
    elementwise: bool = False             # maps element i of each operand to element i
    expensive: bool = False               # not worth duplicating into several consumers
    side_effecting: bool = False          # must not be removed by DCE / reordered freely
    infer: Optional[Callable] = None      # (operand_shapes, attrs, inst) -> shape
    verify: Optional[Callable] = None     # (inst) -> None, raises VerifierError
    evaluate: Optional[Callable] = None   # (inst, operand_values, ctx) -> value

    def __repr__(self) -> str:
        return f"OpDef({self.name})"


OPS: dict[str, OpDef] = {}


def _def(name: str, category: str, arity: int = VARIADIC, **kw) -> None:
    OPS[name] = OpDef(name, category, arity, **kw)


# --- elementwise -----------------------------------------------------------------------
_UNARY_CHEAP = ["abs", "ceil", "floor", "negate", "not", "sign", "round-nearest-afz",
                "round-nearest-even", "real", "imag", "is-finite", "popcnt",
                "count-leading-zeros", "copy", "convert", "bitcast-convert", "reduce-precision"]
_UNARY_EXPENSIVE = ["cbrt", "cosine", "erf", "exponential", "exponential-minus-one", "log",
                    "log-plus-one", "logistic", "rsqrt", "sine", "sqrt", "tan", "tanh"]
_BINARY_CHEAP = ["add", "and", "compare", "complex", "maximum", "minimum", "multiply", "or",
                 "shift-left", "shift-right-arithmetic", "shift-right-logical", "subtract",
                 "xor"]
_BINARY_EXPENSIVE = ["atan2", "divide", "power", "remainder"]
for _n in _UNARY_CHEAP:
    _def(_n, ELEMENTWISE, 1, elementwise=True)
for _n in _UNARY_EXPENSIVE:
    _def(_n, ELEMENTWISE, 1, elementwise=True, expensive=True)
for _n in _BINARY_CHEAP:
    _def(_n, ELEMENTWISE, 2, elementwise=True)
for _n in _BINARY_EXPENSIVE:
    _def(_n, ELEMENTWISE, 2, elementwise=True, expensive=True)
_def("select", ELEMENTWISE, 3, elementwise=True)
_def("clamp", ELEMENTWISE, 3, elementwise=True)
_def("stochastic-convert", ELEMENTWISE, 2, elementwise=True)
_def("map", ELEMENTWISE, VARIADIC, elementwise=True)

# --- parameters, constants, ids --------------------------------------------------------
_def("parameter", PARAM_CONST, 0)
_def("constant", PARAM_CONST, 0)
_def("iota", PARAM_CONST, 0)
_def("replica-id", PARAM_CONST, 0)
_def("partition-id", PARAM_CONST, 0)
_def("rng", OTHER, VARIADIC, side_effecting=True)
_def("rng-bit-generator", OTHER, 1, expensive=True)
_def("rng-get-and-update-state", OTHER, 0, side_effecting=True)

# --- data movement ---------------------------------------------------------------------
for _n in ["broadcast", "reshape", "transpose", "reverse", "slice", "bitcast"]:
    _def(_n, DATA_MOVEMENT, 1)
_def("concatenate", DATA_MOVEMENT, VARIADIC)
_def("pad", DATA_MOVEMENT, 2)
_def("dynamic-slice", DATA_MOVEMENT, VARIADIC)
_def("dynamic-update-slice", DATA_MOVEMENT, VARIADIC)
_def("dynamic-reshape", DATA_MOVEMENT, VARIADIC)
_def("gather", DATA_MOVEMENT, 2, expensive=True)
_def("scatter", DATA_MOVEMENT, VARIADIC, expensive=True)
_def("tuple", DATA_MOVEMENT, VARIADIC)
_def("get-tuple-element", DATA_MOVEMENT, 1)
_def("get-dimension-size", OTHER, 1)
_def("set-dimension-size", OTHER, 2)
_def("copy-start", DATA_MOVEMENT, 1)
_def("copy-done", DATA_MOVEMENT, 1)
_def("optimization-barrier", OTHER, 1)
_def("domain", OTHER, 1)
_def("add-dependency", OTHER, 2)
_def("after-all", OTHER, VARIADIC)

# --- reductions ------------------------------------------------------------------------
_def("reduce", REDUCTION, VARIADIC, expensive=True)
_def("reduce-window", REDUCTION, VARIADIC, expensive=True)
_def("select-and-scatter", REDUCTION, 3, expensive=True)
_def("sort", REDUCTION, VARIADIC, expensive=True)
_def("topk", REDUCTION, 1, expensive=True)
_def("batch-norm-training", REDUCTION, 3, expensive=True)
_def("batch-norm-inference", REDUCTION, 5, expensive=True)
_def("batch-norm-grad", REDUCTION, 5, expensive=True)

# --- dot / convolution / linear algebra -----------------------------------------------
_def("dot", DOT_CONV, 2, expensive=True)
_def("ragged-dot", DOT_CONV, 3, expensive=True)
_def("convolution", DOT_CONV, 2, expensive=True)
_def("fft", DOT_CONV, 1, expensive=True)
_def("cholesky", DOT_CONV, 1, expensive=True)
_def("triangular-solve", DOT_CONV, 2, expensive=True)

# --- control flow and calls ------------------------------------------------------------
_def("while", CONTROL_FLOW, 1)
_def("conditional", CONTROL_FLOW, VARIADIC)
_def("call", CONTROL_FLOW, VARIADIC)
_def("fusion", OTHER, VARIADIC)
_def("custom-call", OTHER, VARIADIC, side_effecting=False)
_def("async-start", OTHER, VARIADIC)
_def("async-update", OTHER, 1)
_def("async-done", OTHER, 1)

# --- collectives and host communication ------------------------------------------------
for _n in ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
           "collective-broadcast", "collective-permute", "all-reduce-start",
           "all-gather-start", "collective-permute-start"]:
    _def(_n, COLLECTIVE, VARIADIC, side_effecting=True)
for _n in ["all-reduce-done", "all-gather-done", "collective-permute-done"]:
    _def(_n, COLLECTIVE, 1, side_effecting=True)
for _n in ["send", "recv", "send-done", "recv-done", "infeed", "outfeed"]:
    _def(_n, COLLECTIVE, VARIADIC, side_effecting=True)


class UnknownOpcodeError(HlotkError):
    pass


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise UnknownOpcodeError(f"unknown HLO opcode {name!r}") from None


def rule(kind: str, *opcodes: str):
    """Decorator attaching a rule (``infer``, ``verify`` or ``evaluate``) to opcodes."""
    if kind not in ("infer", "verify", "evaluate"):
        raise ValueError(kind)

    def deco(fn):
        for op in opcodes:
            setattr(get_op(op), kind, fn)
        return fn
    return deco

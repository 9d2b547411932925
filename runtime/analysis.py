"""What ``Compiled.memory_analysis()`` and ``Compiled.cost_analysis()`` report.

Both read only the HLO module (shapes and opcodes); neither runs anything. When the cost
model and buffer assignment land in ``passes/``, these become thin wrappers over them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import hlo
from hlo.ir import Computation, Instruction
from hlo.ops import ELEMENTWISE
from hlo.shape import AnyShape, leaf_paths, subshape


def _bytes(shape: AnyShape) -> int:
    """Bytes of the array leaves of ``shape`` (tuple index tables not counted)."""
    return sum(s.byte_size for _, s in leaf_paths(shape) if s.is_array)


def _elements(shape: AnyShape) -> int:
    return sum(s.size for _, s in leaf_paths(shape) if s.is_array)


# --- memory -------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompiledMemoryStats:
    """Byte counts with the field names of JAX's ``CompiledMemoryStats``.

    - argument / output: the array leaves of the entry's parameters / result.
    - alias: output bytes that share a buffer with a parameter, from the module's
      ``input_output_alias`` (set when arguments are donated).
    - temp: for now, the sum of the result sizes of every entry instruction that is not a
      parameter, not part of the output, not a constant (XLA keeps constants in their own
      read-only allocations) and not a view of another buffer (get-tuple-element, bitcast,
      tuple). It is an upper bound: no buffer reuse is modelled until buffer assignment
      exists, and called computations (fusion bodies, loop bodies) are not included.
    - generated_code: 0, the reference interpreter generates no code.
    - host_*: 0, nothing is placed in host memory.
    """
    argument_size_in_bytes: int
    output_size_in_bytes: int
    alias_size_in_bytes: int
    temp_size_in_bytes: int
    generated_code_size_in_bytes: int = 0
    host_generated_code_size_in_bytes: int = 0
    host_argument_size_in_bytes: int = 0
    host_output_size_in_bytes: int = 0
    host_alias_size_in_bytes: int = 0
    host_temp_size_in_bytes: int = 0


_VIEW_OPS = {"get-tuple-element", "bitcast", "tuple", "parameter", "constant"}
_ALIAS_ENTRY = re.compile(r"\{([\d,\s]*)\}\s*:\s*\(\s*(\d+)\s*,\s*\{([\d,\s]*)\}")


def _alias_pairs(module: hlo.Module) -> list[tuple[tuple[int, ...], int]]:
    """(output index path, parameter number) pairs from ``input_output_alias``."""
    raw = module.config.get("input_output_alias")
    if raw is None:
        return []
    text = getattr(raw, "text", raw)
    if not isinstance(text, str):
        text = str(text)
    pairs = []
    for out_idx, param, _ in _ALIAS_ENTRY.findall(text):
        path = tuple(int(i) for i in out_idx.replace(" ", "").split(",") if i)
        pairs.append((path, int(param)))
    return pairs


def _output_instructions(root: Instruction) -> set[int]:
    """Instructions whose buffers are (part of) the result: the root and tuple operands."""
    out: set[int] = set()
    stack = [root]
    while stack:
        inst = stack.pop()
        out.add(id(inst))
        if inst.opcode == "tuple":
            stack.extend(inst.operands)
    return out


def memory_analysis(module: hlo.Module) -> CompiledMemoryStats:
    entry = module.entry
    assert entry is not None and entry.root is not None
    argument = sum(_bytes(p.shape) for p in entry.parameters)
    output = _bytes(entry.root.shape)
    alias = 0
    for path, _param in _alias_pairs(module):
        try:
            alias += _bytes(subshape(entry.root.shape, path))
        except (AttributeError, IndexError):
            continue
    outputs = _output_instructions(entry.root)
    temp = sum(_bytes(i.shape) for i in entry.instructions
               if i.opcode not in _VIEW_OPS and id(i) not in outputs)
    return CompiledMemoryStats(argument_size_in_bytes=argument, output_size_in_bytes=output,
                               alias_size_in_bytes=alias, temp_size_in_bytes=temp)


# --- cost -----------------------------------------------------------------------------------
# Ops XLA's HloCostAnalysis counts as transcendentals (one per element) instead of flops.
TRANSCENDENTAL = {"exponential", "exponential-minus-one", "log", "log-plus-one", "power",
                  "rsqrt", "sqrt", "cbrt", "tanh", "sine", "cosine", "tan", "atan2",
                  "logistic", "erf"}
# Elementwise ops that move data without arithmetic.
_NO_FLOP_ELEMENTWISE = {"copy", "bitcast-convert", "real", "imag"}
# Ops that produce no new bytes (views and leaves): no bytes accessed, as in XLA.
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all"}


@dataclass
class _Cost:
    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_accessed: float = 0.0

    def add(self, other: "_Cost", times: float = 1.0) -> None:
        self.flops += other.flops * times
        self.transcendentals += other.transcendentals * times
        self.bytes_accessed += other.bytes_accessed * times


def _dot_macs(inst: Instruction) -> int:
    lhs = inst.operands[0].shape
    contracting = math.prod(lhs.dims[d] for d in inst.attrs.get("lhs_contracting_dims", ()))
    return _elements(inst.shape) * contracting


def _conv_macs(inst: Instruction) -> int:
    """Output elements x (kernel input features x kernel window). Padding is not subtracted."""
    labels = inst.attrs.get("dim_labels")
    kernel = inst.operands[1].shape
    if labels is None:
        return _elements(inst.shape) * math.prod(kernel.dims[:-1])
    per_output = kernel.dims[labels.kernel_input_feature] * math.prod(
        kernel.dims[d] for d in labels.kernel_spatial)
    return _elements(inst.shape) * per_output


def _computation_cost(comp: Computation, memo: dict[int, _Cost]) -> _Cost:
    if id(comp) in memo:
        return memo[id(comp)]
    total = _Cost()
    for inst in comp.instructions:
        total.add(_instruction_cost(inst, memo))
    memo[id(comp)] = total
    return total


def _instruction_cost(inst: Instruction, memo: dict[int, _Cost]) -> _Cost:
    c = _Cost()
    op = inst.opcode
    if op in _FREE:
        return c
    out_elems = _elements(inst.shape)
    called = inst.attrs
    if op in ("while", "conditional", "call", "async-start"):
        # Bodies are counted once (trip counts are unknown statically), as XLA does.
        for sub in inst.called_computations:
            c.add(_computation_cost(sub, memo))
        return c
    c.bytes_accessed = sum(_bytes(o.shape) for o in inst.operands) + _bytes(inst.shape)
    if op == "fusion":
        inner = _computation_cost(called["calls"], memo)
        c.flops, c.transcendentals = inner.flops, inner.transcendentals
    elif op == "dot":
        c.flops = 2 * _dot_macs(inst)
    elif op == "convolution":
        c.flops = 2 * _conv_macs(inst)
    elif op in TRANSCENDENTAL:
        c.transcendentals = out_elems
    elif op == "map":
        inner = _computation_cost(called["to_apply"], memo)
        c.flops, c.transcendentals = inner.flops * out_elems, inner.transcendentals * out_elems
    elif inst.op.category == ELEMENTWISE and op not in _NO_FLOP_ELEMENTWISE:
        c.flops = out_elems
    elif op == "reduce":
        # One application of the reducer per input element that is folded into another.
        # A variadic reducer handles all inputs in one application.
        folded = _elements(inst.operands[0].shape) - _elements(subshape_first(inst.shape))
        reducer = _computation_cost(called["to_apply"], memo)
        c.flops = reducer.flops * folded
        c.transcendentals = reducer.transcendentals * folded
    elif op == "reduce-window":
        window = inst.attrs.get("window")
        size = math.prod(d.size for d in window.dims) if window is not None else 1
        reducer = _computation_cost(called["to_apply"], memo)
        c.flops = reducer.flops * _elements(subshape_first(inst.shape)) * size
        c.transcendentals = reducer.transcendentals * _elements(subshape_first(inst.shape)) * size
    return c


def subshape_first(shape: AnyShape) -> AnyShape:
    """The first leaf of a (variadic reduce's) tuple result, else the shape itself."""
    return shape.elements[0] if shape.is_tuple else shape


def cost_analysis(module: hlo.Module) -> dict[str, float]:
    """{"flops", "transcendentals", "bytes accessed"} for one run of the entry computation.

    flops: 2 per multiply-accumulate of dot/convolution, 1 per element of arithmetic
    elementwise ops, reducer cost per folded element of reduce/reduce-window.
    transcendentals: 1 per element of exp, log, tanh, sqrt, rsqrt, ... (see TRANSCENDENTAL).
    bytes accessed: operand + result bytes of every instruction that computes something
    (parameters, constants, tuples and views count 0); a fusion counts only its boundary.
    """
    c = _computation_cost(module.entry, {})
    return {"flops": float(c.flops), "transcendentals": float(c.transcendentals),
            "bytes accessed": float(c.bytes_accessed)}


def op_histogram(module: hlo.Module) -> dict[str, int]:
    """Opcode -> count over the entry computation, most frequent first."""
    counts: dict[str, int] = {}
    for inst in module.entry.instructions:
        counts[inst.opcode] = counts.get(inst.opcode, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


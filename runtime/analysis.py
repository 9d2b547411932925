"""What ``Compiled.memory_analysis()`` and ``Compiled.cost_analysis()`` report.

Neither runs anything: memory sizes come from buffer assignment, costs from the HLO.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import hlo
from hlo.ir import Computation, Instruction
from hlo.ops import ELEMENTWISE
from hlo.shape import AnyShape, leaf_paths


def _bytes(shape: AnyShape) -> int:
    """Bytes of the array leaves of ``shape`` (tuple index tables not counted)."""
    return sum(s.byte_size for _, s in leaf_paths(shape) if s.is_array)


def _elements(shape: AnyShape) -> int:
    return sum(s.size for _, s in leaf_paths(shape) if s.is_array)


# --- memory -------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompiledMemoryStats:
    """Byte counts with the field names of JAX's ``CompiledMemoryStats``, from the buffer
    assignment the CPU executable runs with (passes/buffer_assignment.py).

    - argument / output: the array leaves of the entry's parameters / result.
    - alias: output bytes that share a buffer with a donated parameter
      (``input_output_alias``), so they need no memory of their own.
    - temp: the size of the one temp arena (every temporary at its heap-simulator offset,
      including loop bodies and branches; fusion intermediates are not buffers).
    - generated_code: bytes of generated kernel source (0 when no fusion was compiled).
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
    # hlotk extras (not in JAX): read-only constant bytes and the arena's lower bound.
    constant_size_in_bytes: int = 0
    temp_lower_bound_in_bytes: int = 0


def memory_analysis(module: hlo.Module, assignment=None) -> CompiledMemoryStats:
    """Sizes from ``assignment`` (or one computed now; an unscheduled module is scheduled
    on a copy first)."""
    if assignment is None:
        from passes.buffer_assignment import assign_buffers
        if not module.is_scheduled:
            from passes.scheduling import Schedule
            module = module.clone()
            Schedule().run(module)
        assignment = assign_buffers(module)
    code = 0
    for inst in assignment.module.all_instructions():
        kernel = None
        if inst.opcode == "fusion":
            try:
                from codegen.cpu import _BY_INST  # compiled kernels are memoised there
                kernel = _BY_INST.get(inst)
            except ImportError:
                kernel = None
        if kernel is not None:
            code += len(getattr(kernel[1], "source", "") or "")
    return CompiledMemoryStats(argument_size_in_bytes=assignment.argument_size(),
                               output_size_in_bytes=assignment.output_size(),
                               alias_size_in_bytes=assignment.alias_size(),
                               temp_size_in_bytes=assignment.temp_size,
                               generated_code_size_in_bytes=code,
                               constant_size_in_bytes=assignment.constant_size(),
                               temp_lower_bound_in_bytes=assignment.lower_bound)


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


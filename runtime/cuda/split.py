"""Splitting a GEMM fusion the Triton GEMM template cannot tile into cuBLAS + loop kernels.

The GEMM template takes one dot with one free dim per side whose result is read at its own
tile; anything else (a rank-3 lhs, a dot read through a transposing bitcast ...) would fall
to the generic kernel, which runs the dot as a serial loop per output element: correct, but
orders of magnitude slow. Instead the fusion runs as

    prologue kernels (each dot operand that is not a plain parameter, materialized)
    -> the dot through cuBLAS (codegen/library/cublas.py)
    -> one loop kernel for the rest of the fused computation (the epilogue)

with the intermediate values in scratch buffers the executable owns. XLA:GPU makes the same
choice when its Triton GEMM emitter declines a fusion: cuBLAS plus separate fusions.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from hlo.ir import Computation, Instruction
from runtime.thunks import Slot

Extract = tuple[Instruction, list[Slot]]


def extract(comp: Computation, roots: list[Instruction], known: dict[int, Slot],
            name: str) -> Extract:
    """A stand-alone fusion computing ``roots`` of ``comp``; every value in ``known`` (by id)
    becomes a parameter read from its slot. Returns the fusion and its input slots."""
    body = Computation(name)
    mapping: dict[int, Instruction] = {}
    inputs: list[Slot] = []

    def clone(v: Instruction) -> Instruction:
        got = mapping.get(id(v))
        if got is not None:
            return got
        if id(v) in known:
            c = Instruction("parameter", [], v.shape, name=f"param_{len(inputs)}",
                            parameter_number=len(inputs))
            inputs.append(known[id(v)])
        else:
            if v.opcode == "parameter":
                raise KeyError(f"parameter %{v.name} has no slot")
            c = Instruction(v.opcode, [clone(o) for o in v.operands], v.shape, dict(v.attrs),
                            name=v.name, literal=v.literal)
        mapping[id(v)] = body.add_instruction(c)
        return mapping[id(v)]

    outs = [clone(r) for r in roots]
    if len(outs) == 1:
        body.root = outs[0]
        shape = outs[0].shape
    else:
        from hlo.shape import TupleShape
        body.root = body.add_instruction(Instruction("tuple", outs, TupleShape(tuple(o.shape for o in outs)),
                                                     name="tuple"))
        shape = body.root.shape
    stand_ins = [Instruction("parameter", [], s.shape, name=f"in{k}", parameter_number=k)
                 for k, s in enumerate(inputs)]
    fusion = Instruction("fusion", stand_ins, shape, {"kind": "kLoop", "calls": body}, name=name)
    body.fusion_instruction = fusion
    return fusion, inputs


def split_gemm_fusion(inst: Instruction, operand_slots: list[Slot], output_slots: list[Slot],
                      scratch: Callable[[Any], Slot], kernel: Callable[[Instruction, list[Slot], list[Slot]], Any],
                      library: Callable[..., Any]) -> Optional[list]:
    """Thunks running fusion ``inst`` as prologue kernels + cuBLAS + an epilogue kernel, or
    None when it has no single dot cuBLAS takes. ``scratch(shape)`` makes a buffer;
    ``kernel(fusion, ins, outs)`` / ``library(dot, ins, outs[, epilogue])`` make thunks (an
    epilogue the library applies, a ``LibraryEpilogue``, its bias or residual the third input)."""
    from codegen.library.cublas import epilogue_supports, plan
    from passes.fusion.gemm_epilogue import library_epilogue
    from passes.fusion.split_gemm import epilogue_after
    comp: Computation = inst.attrs["calls"]
    dots = [i for i in comp.instructions if i.opcode == "dot"]
    if len(dots) != 1 or plan(dots[0]) is None:
        return None
    dot = dots[0]
    params = sorted(comp.parameters, key=lambda p: p.parameter_number)
    known: dict[int, Slot] = {id(p): s for p, s in zip(params, operand_slots)}
    root = comp.root
    outs = list(root.operands) if root.opcode == "tuple" else [root]
    thunks: list = []
    for k, x in enumerate(dot.operands):
        if id(x) in known:
            continue
        src = x
        while src.opcode == "bitcast" and id(src) not in known:
            src = src.operands[0]
        if src is not x and id(src) in known:
            # Bitcasts only: the same bytes seen with x's shape and layout; cuBLAS reads
            # them in place (a kernel would copy them for nothing).
            s = known[id(src)]
            known[id(x)] = Slot(s.allocation, s.offset, x.shape)
            continue
        slot = scratch(x.shape)
        f, ins = extract(comp, [x], known, f"{inst.name}.prologue{k}")
        thunks.append(kernel(f, ins, [slot]))
        known[id(x)] = slot
    if outs == [dot] and output_slots[0].shape.layout == dot.shape.layout:
        thunks.append(library(dot, [known[id(x)] for x in dot.operands], [output_slots[0]]))
        return thunks
    lib = library_epilogue(dot, epilogue_after(dot, outs, {id(i) for i in comp.instructions}),
                           outs) if len(outs) == 1 else None
    if lib is not None and output_slots[0].shape.layout == dot.shape.layout and \
            epilogue_supports(dot) and all(id(x) in known for x in lib.inputs) and \
            (lib.addend is None or known[id(lib.addend)].shape.layout == dot.shape.layout):
        # The bias and activation, or the residual, are cuBLAS's epilogue: one GEMM, no
        # epilogue kernel.
        dins = [known[id(x)] for x in dot.operands] + [known[id(x)] for x in lib.inputs]
        thunks.append(library(dot, dins, [output_slots[0]], lib))
        return thunks
    dslot = scratch(dot.shape)
    thunks.append(library(dot, [known[id(x)] for x in dot.operands], [dslot]))
    known[id(dot)] = dslot
    f, ins = extract(comp, outs, known, f"{inst.name}.epilogue")
    thunks.append(kernel(f, ins, output_slots))
    return thunks

"""What a GEMM fusion costs when the backend runs it as library GEMM + loop kernels.

The CUDA backend's Triton GEMM template tiles a dot with one contracting and one free
dimension per side (batch dimensions allowed) whose fused outputs all have the dot's
shape. Any other GEMM fusion (a rank-3 activation times a weight, a weight gradient that
contracts batch and sequence) runs split (runtime/cuda/split.py):

    one prologue kernel per dot operand computed inside the fusion (written out)
    -> cuBLAS on the materialized operands
    -> one epilogue kernel for the fused computation after the dot (if any), or none when
       the library applies it itself (bias, GELU, ReLU: gemm_epilogue.py).

Fusing a producer into such a GEMM therefore saves nothing: its value is written out and
read back either way, and duplicating it into several such GEMMs computes and writes it
once per GEMM (on the H200 training step: a layer norm recomputed by 6 GEMM fusions, every
f32 weight converted to bf16 twice, 34 prologue kernels). With ``fusion{split_gemms=true}``
the cost model prices a group holding such a dot as those kernels, so the policy keeps the
producer in its own kernel, computed once, whenever that is cheaper; explain-fusion says
why. XLA's GPU pipeline makes the same call: a dot its GEMM emitter declines becomes a
cuBLAS custom call whose operands other fusions produce.
"""
from __future__ import annotations

from typing import Optional, Sequence

from hlo.dots import dot_dims
from hlo.ir import Instruction

from .cost_model import (TRANSCENDENTAL, ZERO, DeviceSpec, Estimate, array_bytes, estimate_kernel,
                         is_free, work_of)
from .gemm_epilogue import LibraryEpilogue, library_epilogue


def untiled_reason(dot: Instruction) -> Optional[str]:
    """Why the Triton GEMM template cannot tile ``dot`` (so a GEMM fusion around it runs
    split), or None when it can. Mirrors ``codegen.triton.templates.gemm_template``."""
    _, _, lc, _, lf, rf = dot_dims(dot)
    if len(lc) != 1 or len(lf) != 1 or len(rf) != 1:
        return (f"%{dot.name} contracts {len(lc)} and keeps {len(lf)}+{len(rf)} free dims "
                "(the Triton GEMM template tiles 1 and 1+1)")
    lt, rt = dot.operands[0].shape.dtype, dot.operands[1].shape.dtype
    ints = {"s8", "u8"}
    if lt.name in ints and rt.name in ints:
        return None
    if lt == rt and lt.name in ("bf16", "f16"):
        return None
    if lt.is_float and rt.is_float and lt.bits <= 32 and rt.bits <= 32:
        return None
    return f"%{dot.name} multiplies {lt.name} by {rt.name}"


def cone(roots: Sequence[Instruction], inside: set[int], stop: set[int]) -> list[Instruction]:
    """Instructions of ``inside`` (ids) that ``roots`` need, not crossing ``stop`` (ids),
    in an order with operands first."""
    out: list[Instruction] = []
    seen: set[int] = set()

    def visit(v: Instruction) -> None:
        if id(v) in seen or id(v) not in inside or id(v) in stop:
            return
        seen.add(id(v))
        for o in v.operands:
            visit(o)
        out.append(v)
    for r in roots:
        visit(r)
    return out


def split_reason(instances: Sequence[Instruction], outputs: Sequence[Instruction]) -> Optional[str]:
    """Why a group of ``instances`` writing ``outputs`` would run split, or None: it holds
    one dot that the template cannot tile, or an output not of the dot's shape."""
    dots = [i for i in instances if i.opcode == "dot"]
    if len(dots) != 1:
        return None
    dot = dots[0]
    why = untiled_reason(dot)
    if why is None:
        bad = [o for o in outputs if o.shape.is_array and o.shape.dims != dot.shape.dims]
        if bad:
            why = f"output %{bad[0].name} {list(bad[0].shape.dims)} is not the dot's shape"
    if why is None:
        why = transcendental_prologue(dot, {id(i) for i in instances})
    if why is None:
        lib = epilogue_of_group(instances, outputs)
        if lib is not None:
            why = f"cuBLASLt applies the {lib.label} after %{dot.name} as its epilogue"
    return why


def transcendental_prologue(dot: Instruction, inside: set[int]) -> Optional[str]:
    """Why a GEMM fusion computing a dot operand with transcendental functions runs split
    (GELU's tanh before an MLP's second matmul): the template would recompute each operand
    tile for every output tile reading it (N / BLOCK_N times), which costs more than writing
    the operand once and reading it back. None when no operand is. ``inside``: ids of the
    group's instructions (every instruction of a fused computation)."""
    for x in dot.operands:
        hot = [i for i in cone([x], inside, set()) if i.opcode in TRANSCENDENTAL]
        if hot:
            return (f"%{dot.name}'s operand %{x.name} is computed with {hot[0].opcode}: the "
                    "template would recompute it for every output tile")
    return None


def epilogue_of_group(instances: Sequence[Instruction],
                      outputs: Sequence[Instruction]) -> Optional[LibraryEpilogue]:
    """The library epilogue of a group holding one dot whose operands come from outside
    (or are views of what does) and whose rest is such an epilogue; else None. The CUDA
    backend runs these as one cuBLASLt call even where the Triton template could tile them
    (runtime/cuda/backend.py)."""
    dots = [i for i in instances if i.opcode == "dot"]
    if len(dots) != 1:
        return None
    dot = dots[0]
    inside = {id(i) for i in instances}
    for x in dot.operands:
        if id(x) in inside and not all(is_free(i) for i in cone([x], inside, set())):
            return None                 # a computed operand: the template fuses it
    return library_epilogue(dot, epilogue_after(dot, outputs, inside), outputs)


def library_gemm_reason(instances: Sequence[Instruction], outputs: Sequence[Instruction],
                        spec: DeviceSpec) -> Optional[str]:
    """Why a GEMM fusion the template could tile should run as the library's GEMM plus one
    epilogue kernel instead, or None. Only for one dot on the fusion's inputs (or views of
    them). The generated kernel's shortfall against the library on the dot
    (``spec.generated_gemm_efficiency``) is weighed against what the split adds: the
    product written out and read back, and one more launch. Both grow with the output, so
    for a large product the contracted size decides (on the H200, bf16: above ~1600): the
    SwiGLU gate and up projections of x[4096, 2048] run split (measured: Triton 162 and
    173 us, cuBLAS 127 plus a 22-33 us loop), a projection contracting 1024 does not."""
    if split_reason(instances, outputs) is not None:
        return None
    return _generated_gemm_loses(instances, outputs, spec)


def _generated_gemm_loses(instances: Sequence[Instruction], outputs: Sequence[Instruction],
                          spec: DeviceSpec) -> Optional[str]:
    """``library_gemm_reason`` for a group ``split_reason`` has already said no to."""
    dots = [i for i in instances if i.opcode == "dot"]
    if len(dots) != 1:
        return None
    dot = dots[0]
    scale = spec.generated_gemm_scale(work_of(dot).tensor_kind)
    if scale >= 1.0:
        return None
    inside = {id(i) for i in instances}
    if any(id(x) in inside and not all(is_free(i) for i in cone([x], inside, set()))
           for x in dot.operands):
        return None                     # a computed operand: the split would write it out
    library_us = estimate_kernel([dot], [dot], spec).compute_us
    shortfall = library_us * (1.0 / scale - 1.0)
    round_trip = 2 * array_bytes(dot.shape) / spec.bytes_per_us + spec.kernel_launch_us
    if shortfall <= round_trip:
        return None
    return (f"cuBLAS + an epilogue kernel: the generated GEMM would lose {shortfall:.1f} us "
            f"on %{dot.name} ({spec.key}: {scale:.2f} of the library's rate), more than "
            f"writing the product out and reading it back ({round_trip:.1f} us)")


def fusion_epilogue(fusion: Instruction) -> Optional[LibraryEpilogue]:
    """The epilogue the CUDA backend has cuBLASLt apply for a GEMM fusion it runs split
    (runtime/cuda/split.py), or None: explain-fusion reports it."""
    comp = fusion.attrs["calls"]
    instances = list(comp.instructions)
    root = comp.root
    outs = list(root.operands) if root.opcode == "tuple" else [root]
    dots = [i for i in instances if i.opcode == "dot"]
    if len(dots) != 1 or len(outs) != 1 or split_reason(instances, outs) is None:
        return None
    return library_epilogue(dots[0], epilogue_after(dots[0], outs, {id(i) for i in instances}),
                            outs)


def epilogue_after(dot: Instruction, outputs: Sequence[Instruction],
                   inside: set[int]) -> list[Instruction]:
    """What of ``inside`` (ids) ``outputs`` compute from ``dot``'s result, operands first;
    parameters (a fused computation's inputs, such as a bias) are read, not computed."""
    return [i for i in cone(outputs, inside, {id(dot)}) if i.opcode != "parameter"]


def split_estimate(instances: Sequence[Instruction], outputs: Sequence[Instruction],
                   spec: DeviceSpec, small_constant_elements: int) -> Optional[Estimate]:
    """The cost of the group as split kernels (see module doc), or None if it is not split.
    A group the CUDA backend runs split for speed (``library_gemm_reason``) is priced so
    too: its epilogue then gains nothing from the dot, and fuses where it saves more."""
    if split_reason(instances, outputs) is None and \
            _generated_gemm_loses(instances, outputs, spec) is None:
        return None
    dot = next(i for i in instances if i.opcode == "dot")
    inside = {id(i) for i in instances}
    total = ZERO
    materialized: set[int] = set()
    for x in dot.operands:
        if id(x) not in inside:
            continue
        body = cone([x], inside, set())
        if all(is_free(i) for i in body):
            continue        # a view of an input: cuBLAS reads the input itself
        total = total + estimate_kernel(body, [x], spec, small_constant_elements)
        materialized.add(id(x))
    total = total + estimate_kernel([dot], [dot], spec, small_constant_elements)
    if list(outputs) == [dot]:
        return total
    stop = {id(dot)} | materialized
    epilogue = cone(outputs, inside, stop)
    # Outputs that are the dot or a prologue's value are copied out of scratch by the
    # epilogue (split.py extracts them as parameters of its kernel).
    copied = sum(array_bytes(o.shape) for o in outputs if id(o) in stop)
    if not epilogue:
        return total + Estimate(spec.kernel_launch_us + 2 * copied / spec.bytes_per_us,
                                copied, copied, 0.0, 1, 2 * copied / spec.bytes_per_us, 0.0)
    e = estimate_kernel(epilogue, outputs, spec, small_constant_elements)
    lib = None if copied else library_epilogue(dot, epilogue, outputs)
    if lib is not None:
        # The GEMM applies it to each tile before storing (gemm_epilogue.py): its arithmetic
        # and reading the bias vector or the residual once, no kernel. A residual computed
        # here is priced as dying at the GEMM (the result takes its buffer; buffer
        # assignment decides): where it does not, the call copies it into the result
        # first, which moves what the add kernel it replaces would.
        read = sum(array_bytes(x.shape) for x in lib.inputs)
        written, launches = 0, 0
        if lib.addend is not None and lib.addend.opcode in ("parameter", "constant"):
            # An argument or a constant is never overwritten: the call copies it into the
            # result first, one more kernel that reads and writes it.
            read, written, launches = 2 * read, read, 1
        memory = (read + written) / spec.bytes_per_us
        return total + Estimate(e.compute_us + memory + launches * spec.kernel_launch_us,
                                read, written, e.flops, launches, memory, e.compute_us)
    if copied:
        extra = copied / spec.bytes_per_us
        e = Estimate(e.time_us + extra, e.bytes_read + copied, e.bytes_written, e.flops,
                     1, e.memory_us + extra, e.compute_us)
    return total + e

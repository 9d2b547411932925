"""The elemental lowering of ``gather``: the value of a gather at an output index is its
operand's value at the gathered index, so a fused producer is computed only where it is read.

XLA's semantics, as the reference interpreter implements them (hlo/evaluator/data_movement.py):
an output index splits into batch dims (those not in ``offset_dims``) and offset dims. The
batch index, with the component number inserted at ``index_vector_dim``, reads each
component of the start index vector; component k starts operand dim ``start_index_map[k]``,
clamped to [0, dim - slice_size] so the slice stays inside the operand. Operand batching
dims take the matching batch index; the window dims (neither collapsed nor batching), in
order, take the sorted offset dims. The operand index is the sum.

Because every start is clamped and every offset is below its slice size, the operand index
is always in range: the operand's loads need no mask, as everywhere else in the emitter.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from hlo.dtypes import DType
from hlo.ir import Instruction

from .elemental import tl_type

if TYPE_CHECKING:
    from .elemental import Emitter, Index, Value


def _ints(inst: Instruction, name: str) -> tuple[int, ...]:
    return tuple(int(i) for i in inst.attrs.get(name, ()) or ())


def clamped_start(em: "Emitter", inst: Instruction, raw: str, dtype: DType, hi: int) -> str:
    """``raw`` (an index value of integer type ``dtype``) clamped to [0, hi], as int32.

    Clamping happens in a type that holds every value of ``dtype``, so a large 64-bit or
    unsigned index clamps to ``hi`` instead of wrapping to a negative int32 first."""
    if not dtype.is_integer:
        raise em._unsupported(inst, f"start index of type {dtype.name}")
    if dtype.kind == "uint":
        # Never negative: only the upper clamp, done in the index's own unsigned type.
        top = min(max(hi, 0), (1 << dtype.bits) - 1)
        return em.assign(f"start_{inst.name}", f"tl.minimum({raw}, tl.full([1], {top}, "
                                               f"{tl_type(dtype)})).to(tl.int32)")
    if dtype.bits < 32:
        wide = f"{raw}.to(tl.int32)"
    else:                                    # s32, s64: clamp in their own type
        wide = raw
    expr = f"tl.minimum(tl.maximum({wide}, 0), {max(hi, 0)})"
    if dtype.bits > 32:
        expr = f"({expr}).to(tl.int32)"
    return em.assign(f"start_{inst.name}", expr)


def emit_gather(em: "Emitter", inst: Instruction, idx: "Index") -> "Value":
    """The value of gather ``inst`` at output index ``idx``."""
    operand, indices = inst.operands
    op_dims = tuple(operand.shape.dims)
    idx_shape = indices.shape
    offset_dims = sorted(_ints(inst, "offset_dims"))
    collapsed = set(_ints(inst, "collapsed_slice_dims"))
    start_map = _ints(inst, "start_index_map")
    op_batching = _ints(inst, "operand_batching_dims")
    idx_batching = _ints(inst, "start_indices_batching_dims")
    sizes = _ints(inst, "slice_sizes")
    ivd = int(inst.attrs.get("index_vector_dim", idx_shape.rank))
    out_rank = inst.shape.rank
    batch_out = [d for d in range(out_rank) if d not in offset_dims]
    window = [d for d in range(len(op_dims)) if d not in collapsed and d not in op_batching]
    n_comp = idx_shape.dims[ivd] if ivd < idx_shape.rank else 1
    if (len(sizes) != len(op_dims) or len(window) != len(offset_dims) or n_comp != len(start_map)
            or len(op_batching) != len(idx_batching)
            or len(batch_out) != idx_shape.rank - (1 if ivd < idx_shape.rank else 0)):
        raise em._unsupported(inst, "inconsistent gather dimension numbers")
    batch_index = [idx[d] for d in batch_out]

    def indices_at(k: int) -> tuple[str, ...]:
        if ivd == idx_shape.rank:
            return tuple(batch_index)
        return tuple(batch_index[:ivd]) + (str(k),) + tuple(batch_index[ivd:])

    src: list[str] = ["0"] * len(op_dims)
    terms: list[list[str]] = [[] for _ in op_dims]
    for k, d in enumerate(start_map):
        raw = em.value(indices, indices_at(k))
        if isinstance(raw, tuple):
            raise em._unsupported(inst, "tuple-valued start indices")
        terms[d].append(clamped_start(em, inst, raw, idx_shape.dtype, op_dims[d] - sizes[d]))
    for d_op, d_idx in zip(op_batching, idx_batching):
        terms[d_op].append(batch_index[d_idx if d_idx < ivd else d_idx - 1])
    for d_out, d_op in zip(offset_dims, window):
        terms[d_op].append(idx[d_out])
    for d, ts in enumerate(terms):
        ts = [t for t in ts if t != "0"]
        if len(ts) == 1:
            src[d] = ts[0]
        elif ts:
            src[d] = em.assign(f"i_{inst.name}", " + ".join(ts))
    return em.value(operand, tuple(src))

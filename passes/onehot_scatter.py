"""A scatter that writes one scalar per batch row into a broadcast constant, as an
elementwise select: ``take_along_axis``'s gradient.

``jax.grad`` of ``take_along_axis(x, labels[:, None], axis=-1)`` scatters one update per
row into a [N, V] tensor of zeros. As a scatter that is a [N, V] buffer of zeros written
first (1 GB at a 32k vocabulary, N = 8192, f32), then updated in place, then read by the
softmax gradient: nothing can fuse into a scatter's operand. Each output element receives
at most one update here (one index per batch row, scalar update windows), so

    scatter(broadcast(c), idx, upd)[n, v] = v == idx[n] ? combine(c, upd[n]) : c

exactly, ``combine`` being the scatter's own computation (add, multiply, max, min, and, or,
or replace) and an index outside the dimension matching no ``v`` as the scatter skips it.
The select is elementwise over iotas, the indices and the updates broadcast along the row,
so the softmax gradient's fusion computes it in place and the [N, V] zeros are never
written. Applied only where the operand is a broadcast scalar (the rewrite never reads
more than the scatter did).
"""
from __future__ import annotations

from typing import Optional

from hlo.attrs import SliceDim, SliceSpec
from hlo.dtypes import PRED
from hlo.evaluator.reductions import simple_binary_reducer
from hlo.ir import Instruction
from hlo.shape import Shape

from .rewrite import Rule, emit

# Scatter computations whose combine(c, u) the select can apply elementwise (commutative,
# so the order of the reducer's parameters does not matter), and "replace" (ROOT p1).
_COMBINERS = frozenset({"add", "multiply", "maximum", "minimum", "and", "or"})


def _combiner(inst: Instruction) -> Optional[str]:
    comp = inst.attrs.get("to_apply")
    if comp is None or len(comp.parameters) != 2:
        return None
    root = comp.root
    if root is not None and root.opcode == "parameter" and root.parameter_number == 1 \
            and not root.shape.dims:
        return "replace"
    op = simple_binary_reducer(comp)
    return op if op in _COMBINERS else None


def onehot_scatter(i: Instruction) -> Optional[Instruction]:
    if len(i.operands) != 3 or i.shape.is_tuple:
        return None
    operand, indices, updates = i.operands
    if operand.opcode != "broadcast" or operand.operands[0].shape.dims:
        return None
    combine = _combiner(i)
    a = i.attrs
    if combine is None or a.get("update_window_dims"):
        return None
    rank = i.shape.rank
    inserted = set(a.get("inserted_window_dims", ()))
    to_operand = list(a.get("scatter_dims_to_operand_dims", ()))
    ib = list(a.get("input_batching_dims", ()))
    sib = list(a.get("scatter_indices_batching_dims", ()))
    if set(ib) | inserted != set(range(rank)) or set(ib) & inserted \
            or set(to_operand) != inserted or len(to_operand) != len(inserted):
        return None
    ivd = int(a.get("index_vector_dim", indices.shape.rank))
    idims = list(indices.shape.dims)
    vector = idims[ivd] if ivd < len(idims) else 1
    rows = idims[:ivd] + idims[ivd + 1:]        # the updates' shape: one update per row
    if vector != len(to_operand) or list(updates.shape.dims) != rows:
        return None
    # Scatter-shape positions of the batching dims (indices dims with ivd taken out); every
    # other position must have size 1, so that each batch row holds exactly one update.
    at = {(d if d < ivd else d - 1): ib[sib.index(d)] for d in sib}
    if any(n != 1 for k, n in enumerate(rows) if k not in at):
        return None
    kept = sorted(at)
    bdims = tuple(at[k] for k in kept)
    if list(bdims) != sorted(bdims):
        return None                  # would need a transpose first; not a form JAX emits
    row_dims = tuple(rows[k] for k in kept)
    full = i.shape

    def along_rows(x: Instruction) -> Instruction:
        """``x`` (one value per batch row) broadcast across the operand's other dims."""
        flat = emit(i, "reshape", [x], Shape(x.shape.dtype, row_dims), name="reshape")
        return emit(i, "broadcast", [flat], Shape(x.shape.dtype, full.dims), name="broadcast",
                    dimensions=bdims)
    mask = None
    for c, dim in enumerate(to_operand):
        idx = indices
        if ivd < indices.shape.rank:
            spec = SliceSpec(tuple(SliceDim(c, c + 1, 1) if d == ivd else SliceDim(0, n, 1)
                                   for d, n in enumerate(idims)))
            idx = emit(i, "slice", [indices], Shape(indices.shape.dtype, tuple(
                1 if d == ivd else n for d, n in enumerate(idims))), name="slice", slice=spec)
        pos = emit(i, "iota", [], Shape(indices.shape.dtype, full.dims), name="iota",
                   iota_dimension=dim)
        eq = emit(i, "compare", [pos, along_rows(idx)], Shape(PRED, full.dims),
                  name="compare", direction="EQ")
        mask = eq if mask is None else emit(i, "and", [mask, eq], eq.shape, name="and")
    upd = along_rows(updates)
    value = upd if combine == "replace" else emit(i, combine, [operand, upd], full,
                                                    name=combine)
    return emit(i, "select", [mask, value, operand], full, name="select")


ONEHOT_RULES: list[Rule] = [Rule("onehot-scatter", ("scatter",), onehot_scatter)]

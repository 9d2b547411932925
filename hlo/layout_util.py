"""Physical layouts: mapping logical arrays to the bytes a layout describes, and back.

A ``Layout`` lists dimensions from minor-most (fastest varying in memory) to major-most,
as XLA's ``minor_to_major``. Interpreter values stay *logical* numpy arrays; only code that
looks at raw memory (``bitcast``, the runtime's arena) goes through these helpers.

``physical_dims(shape)`` are the dims in memory order (major-most first), so the physical
array of a value is the logical one transposed by ``reversed(minor_to_major)`` and made
C-contiguous. A shape without a layout is treated as row-major (XLA's default).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from .errors import ShapeError
from .shape import AnyShape, Layout, Shape


def default_layout(rank: int) -> Layout:
    """XLA's default (row-major, descending) layout: ``{rank-1,...,1,0}``."""
    return Layout.row_major(rank)


def layout_of(shape: Shape) -> Layout:
    """The shape's layout, or the default one when none is assigned yet."""
    return shape.layout if shape.layout is not None else default_layout(shape.rank)


def is_default(layout: Layout | None) -> bool:
    """True for ``None`` (unassigned, meaning row-major) and for a descending layout."""
    return layout is None or (layout.is_row_major and not layout.extra)


def _m2m(layout: Layout | Sequence[int] | None, rank: int) -> tuple[int, ...]:
    if layout is None:
        return tuple(range(rank - 1, -1, -1))
    m2m = tuple(layout.minor_to_major) if isinstance(layout, Layout) else tuple(layout)
    if sorted(m2m) != list(range(rank)):
        raise ShapeError(f"layout {{{','.join(map(str, m2m))}}} is not a permutation "
                         f"of the {rank} dimensions")
    return m2m


def major_to_minor(layout: Layout | Sequence[int] | None, rank: int) -> tuple[int, ...]:
    """Logical dimension numbers in memory order, major-most first."""
    return tuple(reversed(_m2m(layout, rank)))


def minor_dim(shape: Shape) -> int:
    """The logical dim of an array ``shape`` that is contiguous in memory (the last one
    without a layout)."""
    return major_to_minor(shape.layout, shape.rank)[-1]


def dense_strides(shape: Shape) -> tuple[int, ...]:
    """Element strides of ``shape``'s logical dims in a dense buffer of its layout (the
    minor-most dim has stride 1)."""
    strides = [0] * shape.rank
    step = 1
    for d in reversed(major_to_minor(shape.layout, shape.rank)):
        strides[d] = step
        step *= shape.dims[d]
    return tuple(strides)


def physical_dims(shape: Shape) -> tuple[int, ...]:
    """The shape's dims in memory order (major-most first)."""
    return tuple(shape.dims[d] for d in major_to_minor(shape.layout, shape.rank))


def to_physical(logical: np.ndarray, layout: Layout | Sequence[int] | None) -> np.ndarray:
    """The C-contiguous array whose bytes are ``logical`` stored with ``layout``."""
    logical = np.asarray(logical)
    perm = major_to_minor(layout, logical.ndim)
    # (not np.ascontiguousarray: it turns a 0-d array into a 1-d one)
    return np.transpose(logical, perm).copy(order="C")


def from_physical(physical: np.ndarray, shape: Shape) -> np.ndarray:
    """The logical array for physical data (in memory order, or flat) of ``shape``."""
    pdims = physical_dims(shape)
    physical = np.asarray(physical)
    if physical.size != shape.size:
        raise ShapeError(f"{physical.size} physical elements cannot hold {shape}")
    physical = physical.reshape(pdims)
    perm = major_to_minor(shape.layout, shape.rank)
    return np.transpose(physical, np.argsort(perm).astype(int)).copy(order="C")


def permute_layout(layout: Layout | Sequence[int] | None, rank: int,
                   permutation: Sequence[int]) -> Layout:
    """The layout that makes ``transpose(x, dimensions=permutation)`` a physical no-op.

    Result dim ``i`` is operand dim ``permutation[i]``; it must keep the operand dim's place in
    memory, so the result's minor_to_major names, in order, the result dims of the operand's
    minor_to_major dims.
    """
    inverse = {p: i for i, p in enumerate(permutation)}
    return Layout(tuple(inverse[d] for d in _m2m(layout, rank)))


def transpose_is_bitcast(operand: Shape, result: Shape, permutation: Sequence[int]) -> bool:
    """A transpose is a bitcast when the result layout is the permuted operand layout."""
    return (permute_layout(operand.layout, operand.rank, permutation).minor_to_major
            == _m2m(result.layout, result.rank))


def _reshape_groups(in_dims: Sequence[int], out_dims: Sequence[int]
                    ) -> Optional[tuple[dict[int, int], dict[int, int], list[list[int]]]]:
    """Split a reshape into minimal groups of operand and result dims with equal products.

    Size-1 dims are left out (they never move data). Returns (operand dim -> group,
    result dim -> group, result dims per group), or None when the element counts differ.
    """
    ins = [d for d, n in enumerate(in_dims) if n != 1]
    outs = [d for d, n in enumerate(out_dims) if n != 1]
    in_group: dict[int, int] = {}
    out_group: dict[int, int] = {}
    out_members: list[list[int]] = []
    i = j = 0
    while i < len(ins) and j < len(outs):
        g = len(out_members)
        gin, gout = [ins[i]], [outs[j]]
        pin, pout = in_dims[ins[i]], out_dims[outs[j]]
        i, j = i + 1, j + 1
        while pin != pout:
            if pin < pout:
                if i == len(ins):
                    return None
                gin.append(ins[i])
                pin *= in_dims[ins[i]]
                i += 1
            else:
                if j == len(outs):
                    return None
                gout.append(outs[j])
                pout *= out_dims[outs[j]]
                j += 1
        in_group.update((d, g) for d in gin)
        out_group.update((d, g) for d in gout)
        out_members.append(gout)
    if i < len(ins) or j < len(outs):
        return None
    return in_group, out_group, out_members


def _group_sequence(order: Sequence[int], group: dict[int, int]) -> Optional[list[int]]:
    """Groups in memory order, if each group's dims are adjacent and in logical order."""
    seq: list[int] = []
    last_dim: dict[int, int] = {}
    for d in order:
        if d not in group:
            continue  # a size-1 dim
        g = group[d]
        if seq and seq[-1] == g:
            if d < last_dim[g]:
                return None
        elif g in last_dim:
            return None  # the group is split by another one
        else:
            seq.append(g)
        last_dim[g] = d
    return seq


def reshape_is_bitcast(operand: Shape, result: Shape) -> bool:
    """A reshape is a bitcast when the elements keep their order in memory.

    Decided symbolically: the reshape splits into groups of dims with equal products; it is
    a bitcast when, on both sides, each group's dims are adjacent in memory and in logical
    order, and the groups come in the same memory order.
    """
    if operand.size != result.size:
        return False
    if operand.size == 0:
        return True
    split = _reshape_groups(operand.dims, result.dims)
    if split is None:
        return False
    in_group, out_group, _ = split
    a = _group_sequence(major_to_minor(operand.layout, operand.rank), in_group)
    b = _group_sequence(major_to_minor(result.layout, result.rank), out_group)
    return a is not None and a == b


def reshape_bitcast_layout(operand: Shape, result_dims: Sequence[int]) -> Optional[Layout]:
    """A layout for the reshape of ``operand`` to ``result_dims`` that makes it a bitcast.

    None when no such layout exists. With a default operand layout the answer is the
    default layout; size-1 result dims sit just major of their logical successor.
    """
    rank = len(result_dims)
    if is_default(operand.layout):
        return default_layout(rank)
    split = _reshape_groups(operand.dims, result_dims)
    if split is None:
        return None
    in_group, _, out_members = split
    seq = _group_sequence(major_to_minor(operand.layout, operand.rank), in_group)
    if seq is None:
        return None
    order = [d for g in seq for d in out_members[g]]
    for t in (d for d in range(rank) if result_dims[d] == 1):
        pos = next((k for k, d in enumerate(order) if d > t), len(order))
        order.insert(pos, t)
    return Layout(tuple(reversed(order)))


def shape_has_layouts(shape: AnyShape) -> bool:
    """True when every array leaf of ``shape`` has a layout (token/scalar leaves count too)."""
    return all(leaf.layout is not None for leaf in shape.leaves() if leaf.is_array)


def with_default_layouts(shape: AnyShape) -> AnyShape:
    """``shape`` with every array leaf given the default layout."""
    from .shape import TupleShape
    if shape.is_tuple:
        return TupleShape(tuple(with_default_layouts(e) for e in shape.elements))
    if shape.is_array:
        return shape.with_layout(default_layout(shape.rank))
    return shape

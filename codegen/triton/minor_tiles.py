"""Whole-row loads of a small minor dimension in the loop template.

An elementwise kernel that reads a parameter at constant positions of its minor dim (the four
coordinates of ``[..., 4]`` boxes, the pairs of ``[..., 2]``, eight bf16 channels) would
otherwise issue one scalar load per position, each warp touching every 16-byte row
four times at a 16-byte stride: four times the load instructions of the bytes it needs, none
of them vectorized. Here the first such read loads the row as a ``[BLOCK, M]`` tile (one
16-byte vector load per thread and row when the minor dim is dense) and every position is
taken out of it with ``tl.split`` (register moves: no arithmetic, so values, NaNs and signed
zeros are the loaded bits).

The tile is built only where it reads no more memory than the scalar loads: a power-of-two
minor dim of at most 16 bytes (one sector holds it), at a constant index, with at least one
other index varying over the block (a row read by every thread alike stays a scalar load).

Strides are launch arguments, so the vector form is guarded by a uniform branch on them: a
minor stride of 1 and the other strides multiples of M make the row offset
``M * (i0 * (s0 // M) + ...)`` provably aligned to M elements (Triton then emits ``ld.v4``);
any other strides take the general tile load, which is correct for every view.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional

from hlo.ir import Instruction

if TYPE_CHECKING:
    from .elemental import Emitter, Index

# Bytes a tile row may hold: one 16-byte vector load.
MAX_ROW_BYTES = 16


def tile_mode() -> str:
    """``HLOTK_MINOR_TILES``: "1" (default) tiles, and the stores of a kernel that loaded one
    marked as one element per thread; "vstore" tiles with Triton's own (vector) stores;
    "0" scalar loads as before (both kept to compare the kernels in one process)."""
    raw = os.environ.get("HLOTK_MINOR_TILES", "1").strip().lower()
    if raw in ("0", "", "off", "false"):
        return "off"
    return "vstore" if raw == "vstore" else "unit-stores"


def minor_tiles_enabled() -> bool:
    return tile_mode() != "off"


def unit_store_hint(em: "Emitter") -> bool:
    """Whether the loop template marks its store offsets as one element per thread: after a
    tile, each thread holds one row's values per register tile (the tile's layout), and a
    vectorized store would first move them through shared memory (a layout change Triton
    inserts); one 4-byte store per element, coalesced across the warp, needs no move. The
    hint (contiguity 1) is always true, so it cannot change what is stored."""
    return em.tiles_used and tile_mode() == "unit-stores"


def _literal(e: str) -> bool:
    return e.lstrip("-").isdigit()


def minor_dim(inst: Instruction) -> int:
    """The logical dim of ``inst`` that is minor in memory (row-major without a layout)."""
    shape = inst.shape
    if shape.layout is None:
        return shape.rank - 1
    from hlo.layout_util import major_to_minor
    return major_to_minor(shape.layout, shape.rank)[-1]


def tile_row_size(inst: Instruction) -> int:
    """M when ``inst`` (a parameter) has a minor dim a tile row can hold, else 0."""
    shape = inst.shape
    if not shape.is_array or shape.rank < 2 or shape.dtype.is_pred or not shape.dtype.bits:
        return 0
    if shape.dtype.bits % 8:
        return 0
    m = shape.dims[minor_dim(inst)]
    if m < 2 or m & (m - 1) or m * shape.dtype.itemsize > MAX_ROW_BYTES:
        return 0
    return m


def tile_column(em: "Emitter", inst: Instruction, idx: "Index", comment: str) -> Optional[str]:
    """The value of parameter ``inst`` at ``idx`` taken from its minor-row tile, or None
    where the scalar load is kept (see the module doc)."""
    size = tile_row_size(inst)
    if not size:
        return None
    m = minor_dim(inst)
    if not _literal(idx[m]) or not 0 <= int(idx[m]) < size:
        return None
    if all(_literal(idx[d]) for d in range(len(idx)) if d != m):
        return None
    n = inst.parameter_number
    key = ("minor_tile", n, tuple(None if d == m else idx[d] for d in range(len(idx))))
    cols = em.lookup(key)
    if cols is None:
        cols = _emit_tile(em, inst, idx, m, size, comment)
        em.scopes[-1][key] = cols
        em.tiles_used = True
    col = cols[int(idx[m])]
    from .elemental import is_narrow_float
    if is_narrow_float(inst.shape.dtype) and not em.round_narrow:
        return em.assign(inst.name, f"{col}.to(tl.float32)")
    return col


def _emit_tile(em: "Emitter", inst: Instruction, idx: "Index", m: int, size: int,
               comment: str) -> list[str]:
    n = inst.parameter_number
    ptr, strides = em.params[n], em.param_strides[n]
    terms = [(idx[d], strides[d]) for d in range(len(idx)) if d != m and idx[d] != "0"]
    rows = em.tile_rows
    fast = " + ".join(f"{i} * ({s} // {size})" for i, s in terms)
    slow = " + ".join(f"{i} * {s}" for i, s in terms)
    dense = " & ".join([f"({strides[m]} == 1)"] + [f"({s} % {size} == 0)" for _, s in terms])
    tile = em.fresh(f"tile_{inst.name}")
    em.line(f"if {dense}:", f"a dense minor dim of {size}: one vector load per row")
    em.line(f"    {tile} = tl.load({ptr} + ({size} * ({fast}) + tl.zeros_like({rows}))[:, None]"
            f" + tl.arange(0, {size})[None, :])", comment)
    em.line("else:")
    em.line(f"    {tile} = tl.load({ptr} + ({slow} + tl.zeros_like({rows}))[:, None]"
            f" + tl.arange(0, {size})[None, :] * {strides[m]})")
    # Split the minor dim bit by bit, lowest first: [B, M] viewed as [B, 2, ..., 2] has
    # position k's lowest bit last, which tl.split takes apart.
    bits = size.bit_length() - 1
    level = {(): tile}
    if bits > 1:
        shape = ", ".join([f"{tile}.shape[0]"] + ["2"] * bits)
        level = {(): em.assign(f"{tile}_v", f"tl.reshape({tile}, [{shape}])")}
    for _ in range(bits):
        nxt = {}
        for prefix, name in level.items():
            lo, hi = em.fresh(f"{tile}_c"), em.fresh(f"{tile}_c")
            em.line(f"{lo}, {hi} = tl.split({name})")
            nxt[prefix + (0,)], nxt[prefix + (1,)] = lo, hi
        level = nxt
    return [level[tuple((k >> j) & 1 for j in range(bits))] for k in range(size)]

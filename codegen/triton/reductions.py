"""Reduction templates (issue 14): one pass over the input wherever the arithmetic allows,
and a two-kernel split where too few programs would share the work.

``rows_template`` here replaces ``templates.rows_template`` (kept as the "legacy" templates,
``HLOTK_REDUCTION_TEMPLATES=legacy``) for every fusion with a reduce:

* ``normalization``: a row that fits one tile (4096 elements, or up to ``row_tile_limit``
  when a looped kernel would read the row more than once): one load, reductions and
  outputs from registers.
* ``rows_onepass``: wider rows, walked in 4096-wide tiles. Reductions are grouped into
  levels (a reduce whose operand reads another reduce of the row is one level up); each
  level is one pass that updates all of its reductions at once. A sum of exp(a - max(a))
  over the row is folded into the pass of its max with an online max and rescaled sum (as
  flash attention does), so log-softmax / cross-entropy reads its logits once. Full-shape
  outputs are stored from the first pass that has every reduction they read.
* ``column_onepass``: the reduced dims are major in memory (layer-norm weight gradients:
  a sum over the token rows of [tokens, features]): a tile of adjacent kept elements
  (256 bytes of each row) walks the reduced rows, all reductions in the same pass. Kept
  elements past the end of a ragged block map onto the last aligned run (not a clamp,
  which hides the contiguity from Triton and turns the tile's layout across the rows),
  and rows whose width is a multiple of 2-8 but not 16 elements get a copy of the loop
  behind a uniform test of the strides, in which Triton sees them aligned (16-byte loads).
* ``split_partials`` + a finishing kernel: when the kept elements are too few to give
  every SM work (a loss reduced to a scalar, a weight gradient over 1024 features), the
  reduced range is cut into P chunks; program (i, p) writes chunk p's partial results to a
  [P, kept] buffer, and a second fusion (``finish_fusion``) reduces the partials with the
  same reducers and computes the outputs. No atomics, no counters: the partial buffers are
  scratch of the executable (runtime/cuda/backend.py), like its temp arena, and the result
  does not depend on which program finishes first.

The kernel's template name (``TritonKernel.template``) says which was chosen; the CUDA
executable's ``describe()`` prints it beside each kernel.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

from hlo.ir import Computation, Instruction
from hlo.shape import Shape

from .elemental import Emitter, Index, TritonCodegenError, is_narrow_float, tl_type
from .templates import (COLUMN_PROGRAMS, NotTileable, Plan, _merge, _reduce_parts, _store,
                        clamp_if, combine_fn, is_sum_reducer, next_pow2, outputs_of, prev_pow2,
                        reduce_tile_rows, row_tile_limit, row_tile_warps)

LEGACY_ENV = "HLOTK_REDUCTION_TEMPLATES"
# Widest row read as a single tile when a looped kernel would read it once anyway; wider
# rows are walked in tiles of this many elements (one 4096-wide pass beat one 32768-wide
# tile for the 32000-wide bf16 cross-entropy row in the earlier issue-14 runs).
ROW_TILE = 4096
# Programs a split reduction aims for: 4 per SM of a 132-SM H100/H200.
SPLIT_PROGRAMS = 528
# A column tile reads this many bytes of each reduced row (two 128-byte lines).
COLUMN_TILE_BYTES = 256
# A split column reduction's tile spans whole rows up to this many kept elements.
SPLIT_ROW_ELEMENTS = 2048
# Tiles (of up to 8192 elements) each program of a split column reduction walks at least.
# Four left mlp_train's [2048, 1000] bias gradient 64 programs for 132 SMs; two give 128.
SPLIT_COLUMN_STEPS = 2
# A column reduction whose one-kernel grid nearly fills the SMs is split only from this
# many input bytes (mlp_train's 8 MB bias gradient ran faster unsplit; its 32 MB ReLU/bias
# gradient beside it, 512 programs of 8 columns, ran 41 us unsplit against 34 us split).
SPLIT_COLUMN_ONEPASS_BYTES = 16 << 20
# Below this many input elements a reduction is never split (a launch costs more).
SPLIT_MIN_ELEMENTS = 1 << 18


def legacy() -> bool:
    """``HLOTK_REDUCTION_TEMPLATES=legacy``: the templates before issue 14's reduction work
    (one pass per reduction, one program per kept element of a column)."""
    return os.environ.get(LEGACY_ENV, "").strip().lower() == "legacy"


def _squeeze(dims: tuple) -> tuple:
    return tuple(d for d in dims if d != 1)


def map_index(dims: tuple, ref_dims: tuple, ref_idx: Index) -> Index:
    """The index of a value shaped ``dims`` that only adds or drops size-1 dims of
    ``ref_dims`` (a [M, 1] row statistic of a reduce to [M]), at ``ref_idx``."""
    if tuple(dims) == tuple(ref_dims):
        return tuple(ref_idx)
    it = iter([i for d, i in zip(ref_dims, ref_idx) if d != 1])
    return tuple("0" if d == 1 else next(it) for d in dims)


@dataclass
class Analysis:
    """What a reduction fusion looks like to the templates."""
    reduces: list[Instruction]
    full_dims: tuple
    red_dims: list[int]
    kept_dims: list[int]
    kept_shape: tuple
    M: int
    R: int
    column: bool
    outs: list[Instruction]
    out_kind: list[str]              # "kept" | "full" per output
    level: dict[int, int]            # id(reduce) -> pass
    online: dict[int, Instruction]   # id(sum of exp) -> the max reduce it rescales against
    width: int                       # bytes per element of the widest full-shaped input
    params: list[Instruction]        # the fused computation's parameters

    @property
    def levels(self) -> int:
        return 1 + max(self.level.values(), default=0)

    def reads_level(self, v: Instruction) -> int:
        """1 + the highest level of a reduce ``v`` reads (0: reads none)."""
        best, stack, seen = 0, list(v.operands) if v.opcode == "reduce" else [v], set()
        while stack:
            x = stack.pop()
            if id(x) in seen:
                continue
            seen.add(id(x))
            if x.opcode == "reduce" and id(x) in self.level:
                best = max(best, self.level[id(x)] + 1)
                continue
            stack.extend(x.operands)
        return best


def _strip(v: Instruction) -> Instruction:
    while v.opcode in ("broadcast", "reshape", "bitcast", "copy") and v.operands:
        v = v.operands[0]
    return v


def _is_max_reducer(comp: Computation) -> bool:
    r = comp.root
    return (r.opcode == "maximum" and len(comp.parameters) == 2
            and {id(o) for o in r.operands} == {id(p) for p in comp.parameters})


def _online_partner(s: Instruction, reduces: list[Instruction]) -> Optional[Instruction]:
    """The max reduce m when ``s`` = sum(exp(a - m)) over the rows m = max(a) reduces
    (f32, m's init -inf): then s can be accumulated in m's pass with rescaling."""
    ops, inits = _reduce_parts(s)
    if len(ops) != 1 or not is_sum_reducer(s.attrs["to_apply"]) or s.shape.dtype.name != "f32":
        return None
    e = ops[0]
    if e.opcode != "exponential" or e.operands[0].opcode != "subtract":
        return None
    a, b = e.operands[0].operands
    m = _strip(b)
    if m.opcode != "reduce" or not any(m is r for r in reduces) or len(m.operands) != 2:
        return None
    init = m.operands[1]
    if init.opcode != "constant" or init.literal is None:
        return None
    import numpy as np
    lit = np.asarray(init.literal, dtype=np.float64).reshape(-1)
    if lit.size != 1 or not (np.isinf(lit[0]) and lit[0] < 0):
        return None
    if m.operands[0] is not a or not _is_max_reducer(m.attrs["to_apply"]) or a.shape.dtype.name != "f32":
        return None
    if b.opcode == "broadcast" and tuple(b.attrs.get("dimensions", ())) != tuple(
            d for d in range(a.shape.rank) if d not in m.attrs["dimensions"]):
        return None
    return m


def analyze(comp: Computation) -> Analysis:
    outs = outputs_of(comp)
    reduces = [i for i in comp.instructions if i.opcode == "reduce"]
    if not reduces:
        raise NotTileable("no reduce")
    first = reduces[0]
    full_dims = tuple(first.operands[0].shape.dims)
    red_dims = sorted(first.attrs["dimensions"])
    for r in reduces:
        if tuple(r.operands[0].shape.dims) != full_dims or sorted(r.attrs["dimensions"]) != red_dims:
            raise NotTileable("reduces over different shapes or dimensions")
    kept_dims = [d for d in range(len(full_dims)) if d not in red_dims]
    kept_shape = tuple(full_dims[d] for d in kept_dims)
    M = math.prod(kept_shape)
    R = math.prod(full_dims[d] for d in red_dims)
    out_kind = []
    for o in outs:
        d = tuple(o.shape.dims)
        if d == kept_shape:
            out_kind.append("kept")
        elif d == full_dims and len(full_dims) != len(kept_shape):
            out_kind.append("full")
        elif _squeeze(d) == _squeeze(kept_shape):
            out_kind.append("kept")          # [M, 1] and the like: size-1 dims added
        elif _squeeze(d) == _squeeze(full_dims) and R > 1:
            out_kind.append("full")
        else:
            raise NotTileable(f"output %{o.name} is neither the reduced nor the full shape")
    layout = first.operands[0].shape.layout
    minor = layout.minor_to_major[0] if layout is not None and layout.minor_to_major else len(full_dims) - 1
    column = minor in kept_dims and M > 1
    online: dict[int, Instruction] = {}
    for r in reduces:
        m = _online_partner(r, reduces)
        if m is not None:
            online[id(r)] = m
    level: dict[int, int] = {}
    by_id = {id(r): r for r in reduces}

    def lvl(r: Instruction, stack: tuple = ()) -> int:
        if id(r) in level:
            return level[id(r)]
        if id(r) in stack:
            raise NotTileable("cyclic reductions")
        m = online.get(id(r))
        if m is not None:
            level[id(r)] = lvl(m, stack + (id(r),))
            return level[id(r)]
        best, todo, seen = 0, list(r.operands), set()
        while todo:
            x = todo.pop()
            if id(x) in seen:
                continue
            seen.add(id(x))
            if id(x) in by_id:
                best = max(best, lvl(x, stack + (id(r),)) + 1)
                continue
            todo.extend(x.operands)
        level[id(r)] = best
        return best
    for r in reduces:
        lvl(r)
    widths = [p.shape.dtype.bits // 8 for p in comp.parameters
              if p.shape.is_array and math.prod(p.shape.dims) == math.prod(full_dims)]
    width = max(widths) if widths else max(1, first.operands[0].shape.dtype.bits // 8)
    return Analysis(reduces, full_dims, red_dims, kept_dims, kept_shape, M, R, column, outs,
                    out_kind, level, online, width, list(comp.parameters))


# --- split decisions --------------------------------------------------------------------------
@dataclass(frozen=True)
class Split:
    parts: int      # P: programs along the reduced range per group of kept elements
    chunk: int      # reduced elements per part (a multiple of every BLOCK_N candidate)
    block_m: int
    block_n: int


def column_block_m(a: Analysis, split: bool) -> int:
    """Kept elements per column tile: 256 bytes of each reduced row when the grid is
    filled by splitting the reduced range; unsplit, as many as leave ~2 programs per SM,
    down to one 32-byte sector per row (a narrower tile wastes DRAM sectors)."""
    wide = max(8, COLUMN_TILE_BYTES // max(1, a.width))
    if split:
        return min(next_pow2(a.M), wide)
    narrow = max(1, 32 // max(1, a.width))
    return min(next_pow2(a.M), max(narrow, min(wide, prev_pow2(max(1, a.M // COLUMN_PROGRAMS)))))


def split_of(comp: Computation) -> Optional[Split]:
    """How to cut this reduction fusion into partials + finish, or None (one kernel).

    Split when the one-kernel grid would leave SMs idle (fewer programs than
    ``COLUMN_PROGRAMS``) over a large input, and the fusion is one pass: its reductions
    read no other reduction, and its full-shape outputs (stored by the partials kernel,
    as a ReLU gradient beside its bias gradient) read none either. The finishing kernel
    computes the row-shaped outputs from the reductions."""
    if legacy():
        return None
    try:
        a = analyze(comp)
    except NotTileable:
        return None
    if a.M * a.R < SPLIT_MIN_ELEMENTS or not any(k == "kept" for k in a.out_kind):
        return None
    if any(k == "full" and a.reads_level(o) for o, k in zip(a.outs, a.out_kind)):
        return None      # a full-shape output after a reduction: the row is needed twice
    if a.levels != 1 or a.online:
        return None
    for r in a.reduces:
        ops, _ = _reduce_parts(r)
        if any(not o.shape.is_array for o in ops):
            return None
    if a.column:
        one_pass = -(-a.M // column_block_m(a, split=False))
        if (10 * one_pass >= 9 * (COLUMN_PROGRAMS // 2)
                and a.M * a.R * a.width < SPLIT_COLUMN_ONEPASS_BYTES):
            # The one-kernel grid nearly fills the SMs and the input is small: a second
            # launch and the partials cost more than they save (mlp_train's [2048, 1000]
            # bias gradient, H200 graph replays: one column kernel of 125 programs 9.2 us,
            # the best split 10.5, the default split 11.0; a same-size copy 8.3).
            return None
        # Whole rows (up to 2048 kept elements) per tile, a few rows per step: each
        # program streams a contiguous band of the input. Column tiles of 256 bytes over
        # 128-row chunks measured 20% of copy bandwidth on the LN weight gradient
        # [8192, 1024] bf16 (H200): eight programs reading every DRAM row at 2 KiB stride.
        bm = min(next_pow2(a.M), max(COLUMN_TILE_BYTES // max(1, a.width), SPLIT_ROW_ELEMENTS))
        bn = max(2, 8192 // bm)
        programs = -(-a.M // bm)
        unit = bn
        # ~2 programs per SM, each at least SPLIT_COLUMN_STEPS tiles: the [P, kept] f32
        # partials stay a small share of the input (and mostly in L2).
        parts = max(1, min(SPLIT_PROGRAMS // 2 // programs,
                           -(-a.R // (SPLIT_COLUMN_STEPS * unit))))
    else:
        bm, bn, unit = 1, ROW_TILE, 8192
        programs = a.M
        if next_pow2(a.R) <= ROW_TILE and a.M >= 8:
            return None      # short rows: the row template's BLOCK_M rows per program
        if programs >= COLUMN_PROGRAMS:
            return None
        parts = max(1, min(SPLIT_PROGRAMS // programs, -(-a.R // (2 * unit))))
    if programs >= COLUMN_PROGRAMS:
        return None
    if parts < 2:
        return None
    chunk = -(-a.R // parts)
    chunk = -(-chunk // unit) * unit
    parts = -(-a.R // chunk)
    if parts < 2:
        return None
    return Split(parts, chunk, bm, min(bn, unit))


def partial_shapes(comp: Computation, split: Split) -> list[Shape]:
    """The partial buffers of a split reduction: one [P, *kept] per reduction result (f32
    for sums of narrow floats, else the reduce's own element type), row-major."""
    return partial_shapes_of(analyze(comp), split)


def finish_fusion(fusion: Instruction, split: Split) -> Instruction:
    """A fusion computing ``fusion``'s outputs from its partial buffers: parameters are the
    original ones (same numbers) followed by the partials; each reduce becomes a reduce of
    its partials over dim 0 with the same reducer and init (sums of narrow floats: an f32
    sum, then a convert). Only what the outputs read is cloned."""
    comp: Computation = fusion.attrs["calls"]
    a = analyze(comp)
    body = Computation(f"{comp.name}.finish")
    params = sorted(comp.parameters, key=lambda p: p.parameter_number)
    mapping: dict[int, Instruction] = {}
    for p in params:
        mapping[id(p)] = body.add_instruction(Instruction(
            "parameter", [], p.shape, name=p.name, parameter_number=p.parameter_number))
    n = len(params)
    pshapes = partial_shapes_of(a, split)
    partials = [body.add_instruction(Instruction("parameter", [], s, name=f"partial_{k}",
                                                 parameter_number=n + k))
                for k, s in enumerate(pshapes)]
    first: dict[int, int] = {}
    k = 0
    for r in a.reduces:
        first[id(r)] = k
        k += len(_reduce_parts(r)[1])
    adder: list[Computation] = []

    def clone(v: Instruction) -> Instruction:
        got = mapping.get(id(v))
        if got is not None:
            return got
        if v.opcode != "reduce":
            new = Instruction(v.opcode, [clone(o) for o in v.operands], v.shape, dict(v.attrs),
                              name=v.name, literal=v.literal)
            mapping[id(v)] = body.add_instruction(new)
            return mapping[id(v)]
        ops, inits = _reduce_parts(v)
        mine = partials[first[id(v)]:first[id(v)] + len(inits)]
        new_inits = [clone(i) for i in inits]
        if len(ops) == 1 and is_sum_reducer(v.attrs["to_apply"]) and is_narrow_float(inits[0].shape.dtype):
            if not adder:
                adder.append(_f32_add())
            z = body.add_instruction(Instruction("convert", [new_inits[0]], mine[0].shape.__class__(
                mine[0].shape.dtype, ()), name=f"{v.name}.init"))
            red = body.add_instruction(Instruction(
                "reduce", [mine[0], z], mine[0].shape.__class__(mine[0].shape.dtype, a.kept_shape),
                {"dimensions": [0], "to_apply": adder[0]}, name=f"{v.name}.f32"))
            mapping[id(v)] = body.add_instruction(Instruction("convert", [red], v.shape, name=v.name))
        else:
            mapping[id(v)] = body.add_instruction(Instruction(
                "reduce", mine + new_inits, v.shape, dict(v.attrs, dimensions=[0]), name=v.name))
        return mapping[id(v)]
    _, kept = split_outputs(comp)
    outs = [clone(o) for o in (a.outs[k] for k in kept)]
    if len(outs) == 1 and len(a.outs) == 1:
        body.root = outs[0]
        shape = comp.root.shape
    elif len(outs) == 1:
        body.root = outs[0]
        shape = outs[0].shape
    else:
        from hlo.shape import TupleShape
        shape = TupleShape(tuple(o.shape for o in outs))
        body.root = body.add_instruction(Instruction("tuple", outs, shape, name="tuple"))
    stand_ins = [Instruction("parameter", [], p.shape, name=f"in{j}", parameter_number=j)
                 for j, p in enumerate(params)]
    stand_ins += [Instruction("parameter", [], s, name=f"partial{j}", parameter_number=n + j)
                  for j, s in enumerate(pshapes)]
    out = Instruction("fusion", stand_ins, shape, {"kind": "kInput", "calls": body},
                      name=f"{fusion.name}.finish")
    body.fusion_instruction = out
    return out


def _f32_add() -> Computation:
    from hlo.shape import scalar
    f32 = scalar("f32")
    c = Computation("add_f32.split")
    x = c.add_instruction(Instruction("parameter", [], f32, name="x", parameter_number=0))
    y = c.add_instruction(Instruction("parameter", [], f32, name="y", parameter_number=1))
    c.root = c.add_instruction(Instruction("add", [x, y], f32, name="sum"))
    return c


# --- the template -----------------------------------------------------------------------------
def rows_template(em: Emitter, comp: Computation, big: bool,
                  max_row_block: Optional[int] = None, split: Optional[Split] = None) -> Plan:
    """Row/column reductions and normalizations (see the module docstring). ``split``: emit
    the partials kernel of a split reduction (outputs: ``partial_shapes``)."""
    a = analyze(comp)
    if max_row_block is None:
        max_row_block = row_tile_limit(comp, a.full_dims)
    full_after = [a.reads_level(o) for o, k in zip(a.outs, a.out_kind) if k == "full"]
    passes = a.levels + (1 if any(lv >= a.levels for lv in full_after) else 0)
    wide = next_pow2(a.R)
    single = (not a.column and split is None
              and (wide <= ROW_TILE or (wide <= max_row_block and passes > 1)))
    if single:
        return _single(em, a, big)
    return _looped(em, a, big, split)


def _rows_prologue(em: Emitter, a: Analysis, big: bool) -> Index:
    em.line("pid = tl.program_id(0)")
    em.line(f"rows = pid{'.to(tl.int64)' if big else ''} * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]",
            f"{a.M} kept elements, BLOCK_M per program")
    em.line(f"row_mask = rows < {a.M}")
    v = _pow2_run(a.M)
    if a.column and v > 1:
        # Column tiles: the kept index is the contiguous one. A plain clamp (every kept
        # element past the end -> M-1) hides that from Triton, which then lays the tile
        # out along the reduced dim: a warp reading 8 rows x 4 columns (seen in the TTGIR
        # of mlp_train's [2048, 1000] bias gradient, compiled here for sm_90). Elements
        # past the end map onto the last aligned run instead, so runs of V stay contiguous.
        em.line(f"if {a.M} % BLOCK_M == 0:", "static: the block divides the extent")
        em.line("    rows_c = rows")
        em.line("else:")
        em.line(f"    RUN: tl.constexpr = min(BLOCK_M, {v})")
        em.line(f"    rows_c = tl.where(row_mask, rows, {a.M} - RUN + rows % RUN)",
                "in range, in aligned runs")
        em.line("    rows_c = tl.max_contiguous(tl.multiple_of(rows_c, [RUN, 1]), [RUN, 1])")
    else:
        clamp_if(em, "rows_c", "rows", a.M, "BLOCK_M")
    return tuple(em.delinearize("r", "rows_c", list(a.kept_shape)))


def _pow2_run(n: int) -> int:
    """The largest power of two <= 16 dividing ``n``."""
    v = 1
    while v < 16 and n % (2 * v) == 0:
        v *= 2
    return v


def _columns(em: Emitter, a: Analysis, kept_idx: Index, start: str, big: bool = False) -> Index:
    """Column indices of a tile that starts at a multiple of 16 (or a row's start),
    kept in range. A ragged tile maps each group of V columns past the end onto the last
    V columns of the row (V: the largest power of two <= 16 dividing R), so runs of V
    stay contiguous and V-aligned, and the hints let Triton load them as vectors; the
    plain clamp (every column past the end -> R-1) made every load scalar."""
    R = a.R
    v = 1
    while v < 16 and R % (2 * v) == 0:
        v *= 2
    em.line(f"cols = {start}tl.arange(0, BLOCK_N)[None, :]{'.to(tl.int64)' if big else ''}")
    em.line(f"col_mask = cols < {R}")
    em.line(f"if {R} % BLOCK_N == 0:", "static: the block divides the extent")
    em.line("    cols_c = cols")
    em.line("else:")
    if v > 1:
        em.line(f"    cols_c = tl.where(col_mask, cols, {R - v} + cols % {v})",
                f"in range, in aligned runs of {v}")
        em.line(f"    cols_c = tl.max_contiguous(tl.multiple_of(cols_c, [1, {v}]), [1, {v}])")
    else:
        em.line(f"    cols_c = tl.minimum(cols, {max(R - 1, 0)})", "clamped: loads stay in bounds")
    red = em.delinearize("c", "cols_c", [a.full_dims[d] for d in a.red_dims])
    return _merge(a.kept_dims, list(kept_idx), a.red_dims, red)


def _store_outputs(em: Emitter, a: Analysis, which: list[int], idx: Index, mask: str,
                   number: Optional[dict] = None) -> None:
    ref = a.full_dims if a.out_kind[which[0]] == "full" else a.kept_shape
    for k in which:
        o = a.outs[k]
        oi = map_index(tuple(o.shape.dims), ref, idx)
        _store(em, (number or {}).get(k, k), o, em.value(o, oi), oi, mask)


def _masked(v: str, pad: str, need: bool) -> str:
    """``v`` as a full [BLOCK_M, BLOCK_N] tile (an iota read along the columns is [1, N]:
    a variadic reduce needs all its operands the same shape), padded past the row."""
    if need:
        return f"tl.broadcast_to(tl.where(col_mask, {v}, {pad}), [BLOCK_M, BLOCK_N])"
    return f"({v} + tl.zeros([BLOCK_M, BLOCK_N], {v}.dtype))"


def _single(em: Emitter, a: Analysis, big: bool) -> Plan:
    """The row in one [BLOCK_M, next_pow2(R)] tile: loads once, reduces in registers."""
    BN = next_pow2(a.R)
    BM = max(1, min(next_pow2(a.M), 4096 // BN if BN <= 4096 else 1))
    warps = row_tile_warps(BM * BN)
    kept_idx = _rows_prologue(em, a, big)
    full_idx = _columns(em, a, kept_idx, "", big)
    need = a.R != BN

    def handler(inst: Instruction, idx: Index) -> object:
        if tuple(idx) != kept_idx:
            raise NotTileable("reduce read at a non-row index")
        operands, inits = _reduce_parts(inst)
        ivs = [em.value(i, ()) for i in inits]
        sum_ = len(operands) == 1 and is_sum_reducer(inst.attrs["to_apply"])
        tiles = [em.assign(f"x_{inst.name}", _masked(em.value(o, full_idx), "0" if sum_ else iv, need))
                 for o, iv in zip(operands, ivs)]
        return reduce_tile_rows(em, inst, tiles, ivs)
    em.reduce_handler = handler
    for k, kind in enumerate(a.out_kind):
        if kind == "full":
            _store_outputs(em, a, [k], full_idx, "row_mask & col_mask")
        else:
            _store_outputs(em, a, [k], kept_idx, "row_mask")
    cfg = {"BLOCK_M": BM, "BLOCK_N": BN, "num_warps": warps, "num_stages": 1}
    cands = [cfg]
    for bm in (1, 2, 4, 8):
        for w in (4, 8, 16):
            if bm <= next_pow2(a.M) and bm * BN <= 32768 and (bm, w) != (BM, warps):
                cands.append(dict(cfg, BLOCK_M=bm, num_warps=w))
    M = a.M
    return Plan("normalization", ["BLOCK_M", "BLOCK_N"], cfg,
                lambda c: (max(1, -(-M // c["BLOCK_M"])),), cands)


# Registers a thread has at 8 warps with 2 programs per SM (64K per SM / 512 threads); the
# split partials kernels compiled for sm_90 used exactly 128 at 8 warps (ptxas -v).
WARP8_REGISTERS = 128


# Of the 255 registers a thread of 4 warps may have, at most this many for the lane
# accumulators: they are read and written every step, so what does not fit spills on every
# step, and the step's loaded values need the rest. conv_bn_grad's two batch-norm gradient
# partials (4 sums a lane, 64 elements a thread at 4 warps: 256) compiled for sm_90 to 255
# registers and 664-688 bytes of stack, and took 0.9-1.2 s of Triton 3.6 compile here
# (1.9-2.4 s in the H200 host's pool) against 0.32-0.34 s at 8 warps (244-254 registers,
# no stack); transformer_train's residual gradient (2 sums, 128) fits: 250, no stack.
WARP4_ACCUMULATOR_REGISTERS = 128


# A split column tile at 8 warps whose lane accumulators (``lane_accumulators`` x elements a
# thread) take more than half of the 128 registers a thread has (WARP8_REGISTERS) gets
# fewer elements a thread (BLOCK_N halved, 8 warps kept) until they take at most
# SPLIT_ACCUMULATOR_REGISTERS. conv_bn_grad's two batch-norm gradient partials (four sums a
# lane; H200, Triton 3.6, i13-split-tiles): 64x128 (32 a thread, 244-254 registers, one
# program per SM) 27.7 / 24.8 us a graph replay, 0.77-0.88 s the longest job of the cold
# pool; 64x64 (16, 160-164 registers, still one program per SM, twice the steps) 28.6 /
# 27.0 us, the program 1.2% slower; 64x32 (8, 102-109 registers: two programs per SM)
# 25.3 / 24.1 us, the program 0.8% faster (0.3295 -> 0.3269 ms), its pool 0.78-0.89 ->
# 0.60 s. One or two sums a lane at 32 a thread (64) stay as they were measured
# (transformer_train, gpt_train_step, mlp_train: i14-pdl, i14-colred, i14-lnsplit).
SPLIT_ACCUMULATOR_TRIGGER = WARP8_REGISTERS // 2
SPLIT_ACCUMULATOR_REGISTERS = 32
SPLIT_ACC_ENV = "HLOTK_SPLIT_ACC_REGISTERS"
# A split column tile keeps at least this many elements a thread (one 16-byte load of bf16).
SPLIT_MIN_ELEMENTS_PER_THREAD = 8


def split_accumulator_registers() -> int:
    """``HLOTK_SPLIT_ACC_REGISTERS``: the lane-accumulator registers a split column tile over
    ``SPLIT_ACCUMULATOR_TRIGGER`` is cut down to at 8 warps (default
    ``SPLIT_ACCUMULATOR_REGISTERS``; 0: no cut, the tiles before i13-split-tiles), to
    compare tiles on a GPU in one process."""
    text = os.environ.get(SPLIT_ACC_ENV, "").strip()
    if not text:
        return SPLIT_ACCUMULATOR_REGISTERS
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise TritonCodegenError(f"{SPLIT_ACC_ENV}={text!r}: expected a register count >= 0 "
                                 "(0: no bound)")
    return value


def split_tile_n(a: "Analysis", block_m: int, block_n: int, warps: int) -> int:
    """BLOCK_N of a split column tile at ``warps``: ``block_n`` where its lane accumulators
    (``lane_accumulators`` x elements a thread) take at most ``SPLIT_ACCUMULATOR_TRIGGER``
    registers; else halved while they exceed ``split_accumulator_registers()``, down to
    ``SPLIT_MIN_ELEMENTS_PER_THREAD``. Halving keeps the part's chunk a multiple of the
    tile (the chunk is one of block_n)."""
    budget = split_accumulator_registers()
    accs = lane_accumulators(a)
    threads = 32 * warps
    if not budget or accs * (block_m * block_n // threads) <= SPLIT_ACCUMULATOR_TRIGGER:
        return block_n
    while (block_n > 2 and accs * (block_m * block_n // threads) > budget
           and block_m * (block_n // 2) // threads >= SPLIT_MIN_ELEMENTS_PER_THREAD):
        block_n //= 2
    return block_n


def lane_accumulators(a: Analysis) -> int:
    """Accumulators a column tile keeps per element: one per reduction value."""
    return sum(len(_reduce_parts(r)[1]) for r in a.reduces)


def tile_registers(a: Analysis, per_thread: int) -> float:
    """A rough count of the 32-bit registers one step of a column tile holds per thread,
    ``per_thread`` elements each: one lane accumulator per reduction value, the loaded
    values of every full-shaped input and the values of every full-shaped output (4-byte
    registers hold 2 bf16 or 1 f32)."""
    accs = lane_accumulators(a)
    full = math.prod(a.full_dims)
    nbytes = sum(p.shape.dtype.bits // 8 for p in a.params
                 if p.shape.is_array and math.prod(p.shape.dims) == full)
    nbytes += sum(o.shape.dtype.bits // 8 for o, k in zip(a.outs, a.out_kind) if k == "full")
    return per_thread * (accs + nbytes / 4)


def _looped(em: Emitter, a: Analysis, big: bool, split: Optional[Split]) -> Plan:
    if a.column:
        BM = split.block_m if split else column_block_m(a, split=False)
        BN = split.block_n if split else max(16, min(next_pow2(a.R), 8192 // BM))
        warps = 8 if BM * BN >= 8192 else 4
        if split is not None and warps == 8 and \
                tile_registers(a, BM * BN // (32 * warps)) > WARP8_REGISTERS and \
                lane_accumulators(a) * BM * BN // (32 * 4) <= WARP4_ACCUMULATOR_REGISTERS:
            # A split column tile whose loads and lane accumulators need more registers
            # than a thread of 8 warps has at 2 programs per SM: 4 warps (255 each).
            # transformer_train's 80 MiB residual gradient (3 bf16 + 1 f32 inputs, two
            # sums; ~144 estimated): its partials kernel 35.2 -> 31.5 us at 4 warps, while
            # the bf16 LN gradients (~96) ran 20.7 at 8 warps and 26.5 at 4 (H200 graph
            # replays, i14-pdl); mlp_train's ReLU/bias split (128) measured 8 warps faster
            # too (34.1 vs 34.5, i14-colred). Not where the accumulators alone would
            # fill a 4-warp thread (WARP4_ACCUMULATOR_REGISTERS): that tile spills every
            # step and is the slowest Triton compile of its program; it stays at 8 warps,
            # and level-1 autotuning then compiles no heavier candidate either.
            warps = 4
        if split is not None and warps == 8:
            # Many sums a lane (conv_bn_grad's batch-norm gradient: four, 64x128 at 8 warps
            # = 32 elements a thread, 128 accumulator registers, 244-254 in all) made the
            # partials kernel its program's slowest Triton compile and one program per
            # SM; at 64x32 (8 a thread, 102-109 registers) two fit, and it runs 3-9%
            # faster (SPLIT_ACCUMULATOR_REGISTERS).
            BN = split_tile_n(a, BM, BN, warps)
        wide = split.block_n if split else BN        # the tile before the accumulator bound
    else:
        BM, BN = 1, split.block_n if split else ROW_TILE
        wide = BN
        warps = 8 if a.width <= 2 else 4
    kept_idx = _rows_prologue(em, a, big)
    if split is not None:
        em.line("pid_p = tl.program_id(1)", f"part of the reduced range ({split.parts} parts)")
        em.line(f"c_lo = pid_p * {split.chunk}")
        em.line(f"c_hi = tl.minimum(c_lo + {split.chunk}, {a.R})")
        lo = "c_lo"
    else:
        lo = "0"
    full_k = [k for k, kind in enumerate(a.out_kind) if kind == "full"]
    out_pass = {k: a.reads_level(a.outs[k]) for k in full_k}

    def handler(inst: Instruction, idx: Index) -> object:
        raise NotTileable("reduce read at a non-row index")
    em.reduce_handler = handler
    results: list[str] = []       # split: each reduction's partial, in partial_shapes order
    for lv in range(a.levels + 1):
        mine = [r for r in a.reduces if a.level[id(r)] == lv]
        stores = [k for k in full_k if out_pass[k] == lv]
        if not mine and not stores:
            continue
        if split is not None and lv > 0:
            raise NotTileable("a split reduction is one pass")
        state = []
        for r in mine:
            if id(r) in a.online:
                continue          # accumulated beside its max, below
            ops, inits = _reduce_parts(r)
            sum_ = len(ops) == 1 and is_sum_reducer(r.attrs["to_apply"])
            ivs = [em.value(i, ()) for i in inits]
            accs = []
            partner = [s for s in a.reduces if a.online.get(id(s)) is r]
            # Lane accumulators ([BLOCK_M, BLOCK_N], reduced across lanes once at the end);
            # a max with an online exp-sum keeps one max and one sum per row instead, so
            # each element costs one exp (per-lane rescaling cost two: the bf16
            # cross-entropy ran at 55% of copy bandwidth on exp throughput, H200).
            # Summing each tile's rows into [BLOCK_M, 1] instead saves registers but, with
            # the rows spread over warps, puts shared-memory barriers in the loop and
            # issues the next input's loads after them: the split LN weight gradients ran
            # 40% slower that way (H200, i14-lnsplit).
            width = "1" if partner else "BLOCK_N"
            for i, iv in zip(inits, ivs):
                dt = "tl.float32" if sum_ and is_narrow_float(i.shape.dtype) else em.repr_type(i.shape.dtype)
                accs.append(em.assign(f"acc_{r.name}", f"tl.zeros([BLOCK_M, {width}], {dt})"
                                      + ("" if sum_ else f" + {iv}")))
            s_acc = None
            if partner:
                s_acc = em.assign(f"acc_{partner[0].name}", "tl.zeros([BLOCK_M, 1], tl.float32)",
                                  "online sum of exp(x - running max), rescaled as the max grows")
            state.append((r, ops, ivs, sum_, accs, partner[0] if partner else None, s_acc))
        whole = f"({a.R} - {a.R} % BLOCK_N)"
        number = ({k: len(partial_shapes_of(a, split)) + j for j, k in enumerate(full_k)}
                  if split is not None else None)   # split: partials first, then these

        def body(kind: str) -> None:
            """One tile of the pass. "whole": an unclamped tile (Triton sees contiguous
            columns and loads 16 bytes per thread). "shifted": the ragged end as the last
            BLOCK_N columns, overlapping tiles already counted (masked off), so its loads
            stay contiguous too. "clamped": a row shorter than one tile."""
            em.push_scope()
            ragged = kind != "whole"
            if kind == "clamped":
                full = _columns(em, a, kept_idx, "c0 + ", big)
            else:
                # (int64 past 2^31 elements: a column index times a row stride overflows)
                em.line(f"cols = c0 + tl.arange(0, BLOCK_N)[None, :]{'.to(tl.int64)' if big else ''}")
                if kind == "shifted":
                    em.line(f"col_mask = cols >= {whole}", "columns no whole tile counted")
                red = em.delinearize("c", "cols", [a.full_dims[d] for d in a.red_dims])
                full = _merge(a.kept_dims, list(kept_idx), a.red_dims, red)
            for r, ops, ivs, sum_, accs, s, s_acc in state:
                vals = [em.value(o, full) for o in ops]
                tiles = [em.assign(f"x_{r.name}", _masked(v, "0" if sum_ else iv, ragged))
                         for v, iv in zip(vals, ivs)]
                if s is not None:
                    m_old = accs[0]
                    fn = combine_fn(em, r.attrs["to_apply"])
                    em.line(f"t_max = tl.reduce({tiles[0]}, 1, {fn}, keep_dims=True)", "this tile's row max")
                    em.line(f"m_new = tl.maximum({m_old}, t_max, propagate_nan=tl.PropagateNan.ALL)")
                    em.line("dead = m_new == -float('inf')", "no finite value yet: keep the sum at 0")
                    em.line(f"t_sum = tl.sum(tl.exp({tiles[0]} - m_new), axis=1, keep_dims=True)")
                    em.line(f"{s_acc} = tl.where(dead, 0.0, {s_acc} * tl.exp({m_old} - m_new) + t_sum)")
                    em.line(f"{m_old} = m_new")
                    continue
                if sum_:
                    em.line(f"{accs[0]} += {tiles[0]}.to({accs[0]}.dtype)")
                else:
                    fn = combine_fn(em, r.attrs["to_apply"])
                    new = em.assign("c", f"{fn}({', '.join(accs + tiles)})")
                    for j, acc in enumerate(accs):
                        em.line(f"{acc} = {new}" if len(accs) == 1 else f"{acc} = {new}[{j}]")
            if stores:
                _store_outputs(em, a, stores, full, "row_mask & col_mask" if ragged else "row_mask",
                               number)
            em.pop_scope()
        def walk() -> None:
            what = (f": {', '.join('%' + r.name for r in mine)}" if mine else ": outputs")
            em.line(f"for c0 in range({lo}, {'tl.minimum(c_hi, ' + whole + ')' if split else whole}, BLOCK_N):",
                    f"pass {lv} over the reduced range{what}")
            body("whole")                 # (push_scope indents the body)
            if split is not None:
                if a.R % BN:
                    em.line(f"if c_hi > {whole}:", "the part holding the ragged end")
                    em.indent += 1
                    em.line(f"c0 = {a.R} - BLOCK_N")
                    em.indent -= 1
                    body("shifted")   # split: R >= 2 chunks >= BLOCK_N
            else:
                em.line(f"if {a.R} % BLOCK_N != 0:", "static: a ragged end")
                em.indent += 1
                em.line(f"if {a.R} >= BLOCK_N:")
                em.indent += 1
                em.line(f"c0 = {a.R} - BLOCK_N")
                em.indent -= 1
                body("shifted")
                em.line("else:")
                em.indent += 1
                em.line("c0 = 0")
                em.indent -= 1
                body("clamped")
                em.indent -= 1
        hinted = _dense_strides(a, number) if a.column else None
        if hinted:
            # Rows of a width that is not a multiple of 16 elements (mlp_train's 1000
            # features): Triton specializes a stride's divisibility by 16 only, so the
            # row stride looks unaligned and every load is scalar. A uniform branch on the
            # strides gives the loop a copy that reads them as RUN * (s // RUN), known
            # multiples of RUN (16-byte loads); other views take the plain loop. (Fresh
            # names: a stride the JIT specialized to the constant 1 cannot be rebound.)
            ins, outs_, names, v = hinted
            cond = " & ".join(f"({n} % {v} == 0)" for n in names)
            em.line(f"if {cond}:", f"dense rows: strides are multiples of {v} elements")
            em.indent += 1
            for n in names:
                em.line(f"h_{n} = {v} * ({n} // {v})")
            saved = {n: list(em.param_strides[n]) for n in ins}
            for n, strides in ins.items():
                em.param_strides[n] = [f"h_{x}" if x in names else x for x in strides]
            em.out_strides = {k: [f"h_{x}" if x in names else x for x in strides]
                              for k, strides in outs_.items()}
            walk()
            em.param_strides.update(saved)
            em.out_strides = {}
            em.indent -= 1
            em.line("else:")
            em.indent += 1
            walk()
            em.indent -= 1
        else:
            walk()
        # The level's reductions, from the lane accumulators (bound for later passes).
        for r, ops, ivs, sum_, accs, s, s_acc in state:
            if split is not None:
                if sum_:
                    results.append(em.assign(f"part_{r.name}", f"tl.sum({accs[0]}, axis=1, keep_dims=True)"))
                else:
                    fn = combine_fn(em, r.attrs["to_apply"])
                    arg = accs[0] if len(accs) == 1 else "(" + ", ".join(accs) + ")"
                    p = em.assign(f"part_{r.name}", f"tl.reduce({arg}, 1, {fn}, keep_dims=True)")
                    results.extend([p] if len(accs) == 1 else
                                   [em.assign(f"part_{r.name}_{j}", f"{p}[{j}]") for j in range(len(accs))])
                continue
            dt = r.shape.dtype if len(accs) == 1 else None
            if sum_:
                val = em.assign(r.name, f"(tl.sum({accs[0]}, axis=1, keep_dims=True) + {ivs[0]})"
                                        f".to({em.repr_type(dt)})", em._comment(r))
            else:
                fn = combine_fn(em, r.attrs["to_apply"])
                arg = accs[0] if len(accs) == 1 else "(" + ", ".join(accs) + ")"
                red = em.assign(r.name, f"tl.reduce({arg}, 1, {fn}, keep_dims=True)", em._comment(r))
                val = red if len(accs) == 1 else tuple(
                    em.assign(f"{r.name}_{j}", f"{red}[{j}]") for j in range(len(accs)))
            em.bind(r, kept_idx, val, outer=True)
            if s is not None:
                sv = em.value(_reduce_parts(s)[1][0], ())
                total = em.assign(s.name, f"{s_acc} + {sv}", em._comment(s))
                em.bind(s, kept_idx, total, outer=True)
    if split is not None:
        shapes = partial_shapes_of(a, split)
        for k, (v, s) in enumerate(zip(results, shapes)):
            em.line(f"tl.store(out{k} + pid_p * so{k}_0"
                    + "".join(f" + {i} * so{k}_{d + 1}" for d, i in enumerate(kept_idx))
                    + ("" if any(not str(i).isdigit() for i in kept_idx) else
                       " + row_mask.to(tl.int32) * 0")   # a scalar per part: a block address
                    + f", ({v}).to({_tl(s)}), mask=row_mask)", f"partial {k}")
        M = a.M
        parts = split.parts
        cfg = {"BLOCK_M": BM, "BLOCK_N": BN, "num_warps": warps, "num_stages": 1}
        cands = [cfg] + [dict(cfg, num_warps=w) for w in (4, 8) if w != warps]
        if wide != BN:        # level 2 also times the wider tile (level 1 leaves it out)
            cands.append(dict(cfg, BLOCK_N=wide, num_warps=8))
        shapes = shapes + [a.outs[k].shape for k in full_k]
        return Plan("split_partials", ["BLOCK_M", "BLOCK_N"], cfg,
                    lambda c: (max(1, -(-M // c["BLOCK_M"])), parts), cands, output_shapes=shapes)
    kept_k = [k for k, kind in enumerate(a.out_kind) if kind == "kept"]
    for k in kept_k:
        _store_outputs(em, a, [k], kept_idx, "row_mask")
    cfg = {"BLOCK_M": BM, "BLOCK_N": BN, "num_warps": warps, "num_stages": 1}
    if a.column:
        cands = [cfg] + [dict(cfg, BLOCK_M=bm, BLOCK_N=bn, num_warps=w)
                         for bm, bn, w in ((32, 128, 4), (64, 64, 4), (64, 128, 8), (128, 32, 4),
                                           (128, 64, 8), (16, 256, 4))
                         if bm <= max(16, next_pow2(a.M)) and (bm, bn, w) != (BM, BN, warps)]
    else:
        cands = [cfg] + [dict(cfg, BLOCK_N=bn, num_warps=w) for bn, w in
                         ((2048, 4), (4096, 4), (4096, 8), (8192, 8), (8192, 16))
                         if (bn, w) != (BN, warps) and bn <= max(2048, next_pow2(a.R))]
    M = a.M
    return Plan("column_onepass" if a.column else "rows_onepass", ["BLOCK_M", "BLOCK_N"], cfg,
                lambda c: (max(1, -(-M // c["BLOCK_M"])),), cands)


def _dense_strides(a: Analysis, number: Optional[dict]
                   ) -> Optional[tuple[dict[int, list[str]], dict[int, list[str]], list[str], int]]:
    """({parameter: stride names}, {output: stride names}, the names to hint, V) for the
    stride branch of a column kernel: every full-shaped input and output laid out as the
    reduction's operand, when the minor extent is a multiple of V (a power of two, 2..8)
    but not of 16; hinted: every stride but the minor dim's and size-1 dims'. None when Triton's own
    specialization suffices (16 | minor extent) or nothing aligns (an odd extent)."""
    layout = a.reduces[0].operands[0].shape.layout
    minor = (layout.minor_to_major[0] if layout is not None and layout.minor_to_major
             else len(a.full_dims) - 1)
    v = _pow2_run(a.full_dims[minor])
    if v in (1, 16):
        return None

    def strides(shape: Shape, base: str) -> Optional[list[str]]:
        if not shape.is_array or tuple(shape.dims) != a.full_dims:
            return None
        lay = shape.layout
        m = lay.minor_to_major[0] if lay is not None and lay.minor_to_major else len(shape.dims) - 1
        if m != minor:
            return None
        return [f"{base}_{d}" for d in range(len(a.full_dims))]
    hint = {d for d in range(len(a.full_dims)) if d != minor and a.full_dims[d] != 1}
    ins = {p.parameter_number: s for p in a.params
           if (s := strides(p.shape, f"s{p.parameter_number}")) is not None}
    outs: dict[int, list[str]] = {}
    for k, (o, kind) in enumerate(zip(a.outs, a.out_kind)):
        j = (number or {}).get(k, k)
        if kind == "full" and (s := strides(o.shape, f"so{j}")) is not None:
            outs[j] = s
    names = [x for ss in list(ins.values()) + list(outs.values()) for x in ss
             if int(x.rsplit("_", 1)[1]) in hint]
    if not names:
        return None
    return ins, outs, names, v


def partial_shapes_of(a: Analysis, split: Split) -> list[Shape]:
    from hlo.shape import array
    shapes = []
    for r in a.reduces:
        ops, inits = _reduce_parts(r)
        sum_ = len(ops) == 1 and is_sum_reducer(r.attrs["to_apply"])
        for init in inits:
            dt = "f32" if sum_ and is_narrow_float(init.shape.dtype) else init.shape.dtype
            dims = (split.parts,) + a.kept_shape
            shapes.append(array(dt, dims, tuple(reversed(range(len(dims))))))
    return shapes


def split_outputs(comp: Computation) -> tuple[list[int], list[int]]:
    """(full-shape output numbers the partials kernel stores, row-shaped output numbers
    the finishing kernel stores), in the fusion's output order."""
    a = analyze(comp)
    return ([k for k, kind in enumerate(a.out_kind) if kind == "full"],
            [k for k, kind in enumerate(a.out_kind) if kind == "kept"])


def _tl(shape: Shape) -> str:
    return tl_type(shape.dtype)


__all__ = ["rows_template", "split_of", "split_outputs", "finish_fusion", "partial_shapes",
           "legacy", "LEGACY_ENV", "Split", "analyze",
           "split_tile_n", "split_accumulator_registers", "SPLIT_ACC_ENV"]

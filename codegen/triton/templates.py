"""Kernel templates: the loop (and generic fallback), row/column reduction + normalization,
and GEMM bodies, each driving the elemental emitter over its own tiling.

A template returns a ``Plan``: the kernel body lines, the block-size constexprs and their
chosen values, and a grid function of those values. A template that cannot tile a fusion
raises ``NotTileable`` and the caller falls back to the generic loop kernel (serial loops for
reductions and dots), which is slow but handles any fusion made of supported ops.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

from hlo.dots import dot_dims
from hlo.ir import Computation, Instruction
from hlo.shape import Shape

from .elemental import Emitter, Index, is_narrow_float, tl_type
from .flat_loop import FLAT_CONFIG, MAX_BLOCK, SCALAR_CONFIG, flat_enabled, flat_reason
from .minor_tiles import minor_tiles_enabled, unit_store_hint


class NotTileable(Exception):
    """This template does not fit the fusion; use another one."""


# Programs a column reduction's grid aims for: two per SM of a 132-SM H100/H200.
COLUMN_PROGRAMS = 264


def prev_pow2(n: int) -> int:
    """The largest power of two <= n (n >= 1)."""
    return 1 << (int(n).bit_length() - 1)


# A row tile's elements per thread in the default config. Measured on the H200
# (benchmarks/norm_configs.py, NOTES session 7): a config's Triton compile grows with its
# elements per thread (softmax [8192,4096]: 8 per thread 0.11 s, 16 0.10, 32 0.19, 64 0.52,
# 128 1.18), and over softmax, layer norm and RMSNorm at five shapes a config of at most 16
# ran within 1.5% of the best of all candidates (32 per thread, the old default, up to 15%
# slower: a 32000-wide softmax).
ROW_TILE_ELEMENTS_PER_THREAD = 16


def row_tile_warps(block_elements: int) -> int:
    """Warps for a [BLOCK_M, BLOCK_N] row tile of ``block_elements``: at most
    ``ROW_TILE_ELEMENTS_PER_THREAD`` elements per thread, 1 to 16 warps, and at least 4 for
    tiles of 2048 elements or more."""
    warps = max(1, min(16, block_elements // (32 * ROW_TILE_ELEMENTS_PER_THREAD)))
    return max(warps, 4) if block_elements >= 2048 else warps


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@dataclass
class Plan:
    template: str
    constexprs: list[str]                       # names of tl.constexpr block parameters
    config: dict                                # chosen values (+ num_warps, num_stages)
    grid: Callable[[dict], tuple]
    candidates: list[dict] = field(default_factory=list)   # configs autotuning may try
    # The kernel's outputs when they are not the fusion's (a split reduction's partials).
    output_shapes: Optional[list[Shape]] = None
    # The parameter whose values the output must already hold: the kernel writes only a
    # window of it (update_slice.py); None for kernels that write every output element.
    in_place: Optional[int] = None
    # A flat loop kernel's element count (flat_loop.py): passed as the runtime argument
    # ``n`` in place of the strides, which such a kernel does not take. None: strided.
    flat_n: Optional[int] = None


def outputs_of(comp: Computation) -> list[Instruction]:
    root = comp.root
    if root.opcode == "tuple":
        return list(root.operands)
    if root.opcode == "reduce" and root.shape.is_tuple:
        # A variadic reduce as the root (argmax): one output per element, read through
        # get-tuple-elements made for the emitter only (not users in the IR).
        outs = []
        for k, e in enumerate(root.shape.elements):
            g = Instruction("get-tuple-element", [root], e, {"index": k}, name=f"{root.name}.{k}")
            root.users.remove(g)
            outs.append(g)
        return outs
    return [root]


def numel(shape: Shape) -> int:
    return math.prod(shape.dims)


def _store(em: Emitter, k: int, out: Instruction, value: str, idx: Index, mask: str,
           unit: bool = False) -> None:
    """``unit``: mark the offsets as one contiguous element per thread (minor_tiles.py)."""
    names = em.out_strides.get(k) or [f"so{k}_{d}" for d in range(len(idx))]
    terms = [f"{i} * {names[d]}" for d, i in enumerate(idx)]
    if unit and terms and not all(str(i).strip().isdigit() for i in idx):
        terms = [f"tl.max_contiguous({' + '.join(terms)}, 1)"]
    addr = f"out{k}" + (" + " + " + ".join(terms) if terms else "")
    if all(str(i).strip().isdigit() for i in idx):
        # A rank-0 output (or one indexed by constants only) has a scalar address: offset it
        # by a zero block shaped like the mask, so a block value and mask meet block pointers.
        addr += f" + ({mask}).to(tl.int32) * 0"
    dt = tl_type(out.shape.dtype)
    em.line(f"tl.store({addr}, ({value}).to({dt}), mask={mask})", f"output {k}: %{out.name}")


def clamp_if(em: Emitter, dst: str, src: str, n: int, block: str) -> None:
    """``dst = src`` clamped into [0, n): a compile-time branch skips the clamp when the
    block divides ``n``, so Triton still sees contiguous, aligned indices (16-byte loads,
    async copies); the clamp is only paid for ragged shapes."""
    em.line(f"if {n} % {block} == 0:", "static: the block divides the extent")
    em.line(f"    {dst} = {src}")
    em.line("else:")
    em.line(f"    {dst} = tl.minimum({src}, {max(n - 1, 0)})", "clamped: loads stay in bounds")


def _reduce_parts(inst: Instruction) -> tuple[list[Instruction], list[Instruction]]:
    n = len(inst.operands) // 2
    return inst.operands[:n], inst.operands[n:]


def _merge(kept_dims: list[int], kept: list[str], red_dims: list[int], red: list[str]) -> Index:
    out = [""] * (len(kept_dims) + len(red_dims))
    for d, e in zip(kept_dims, kept):
        out[d] = e
    for d, e in zip(red_dims, red):
        out[d] = e
    return tuple(out)


def is_sum_reducer(comp: Computation) -> bool:
    r = comp.root
    return (r.opcode == "add" and len(comp.parameters) == 2
            and {id(o) for o in r.operands} == {id(p) for p in comp.parameters})


def combine_fn(em: Emitter, comp: Computation) -> str:
    """A @triton.jit combiner generated from the reducer computation; returns its name."""
    name = f"combine_{''.join(c if c.isalnum() else '_' for c in comp.name)}"
    if name in em.combine_fns:
        return name
    sub = Emitter(em.fusion_name, em.round_narrow)
    n = len(comp.parameters)
    args = [f"a{i}" for i in range(n)]
    res = sub.inline_scalar(comp, args)
    ret = ", ".join(res) if isinstance(res, tuple) else res
    body = "\n".join(sub.lines) or "    pass"
    em.combine_fns[name] = (f"@triton.jit\ndef {name}({', '.join(args)}):\n"
                            f"    # the reducer %{comp.name}\n{body}\n    return {ret}\n")
    return name


# --- generic serial strategies (loop template and fallback) -------------------------------------
def serial_reduce(em: Emitter, inst: Instruction, idx: Index) -> object:
    operands, inits = _reduce_parts(inst)
    red_dims = list(inst.attrs["dimensions"])
    in_dims = operands[0].shape.dims
    kept_dims = [d for d in range(len(in_dims)) if d not in red_dims]
    R = math.prod(in_dims[d] for d in red_dims)
    fn = combine_fn(em, inst.attrs["to_apply"])
    accs = []
    for j, init in enumerate(inits):
        iv = em.value(init, ())
        dt = em.repr_type(init.shape.dtype)
        accs.append(em.assign(f"acc_{inst.name}", f"tl.zeros([BLOCK], {dt}) + {iv}",
                              f"accumulator {j} of %{inst.name}"))
    r = em.fresh("r")
    em.line(f"for {r} in range(0, {R}):", f"serial reduction of %{inst.name} over {R} elements")
    em.push_scope()
    red = em.delinearize(f"k_{inst.name}", r, [in_dims[d] for d in red_dims])
    full = _merge(kept_dims, list(idx), red_dims, red)
    vals = [em.value(o, full) for o in operands]
    new = em.assign(f"c_{inst.name}", f"{fn}({', '.join(accs + vals)})")
    if len(accs) == 1:
        em.line(f"{accs[0]} = {new}")
    else:
        for j, a in enumerate(accs):
            em.line(f"{a} = {new}[{j}]")
    em.pop_scope()
    return accs[0] if len(accs) == 1 else tuple(accs)


def reduce_tile_rows(em: Emitter, inst: Instruction, tiles: list[str], ivs: list[str]) -> object:
    """Reduce the [rows, cols] tiles of ``inst``'s operands along axis 1 (keeping it), its
    inits applied once: a sum in f32 for narrow floats, otherwise the reducer as a combine
    function (a tuple of values for a variadic reduce)."""
    if len(tiles) == 1 and is_sum_reducer(inst.attrs["to_apply"]):
        dt = inst.shape.dtype
        t = f"{tiles[0]}.to(tl.float32)" if is_narrow_float(dt) else tiles[0]
        s = f"(tl.sum({t}, axis=1, keep_dims=True) + {ivs[0]})"
        return em.assign(inst.name, f"{s}.to({em.repr_type(dt)})" if is_narrow_float(dt)
                         else s, em._comment(inst))
    fn = combine_fn(em, inst.attrs["to_apply"])
    arg = tiles[0] if len(tiles) == 1 else "(" + ", ".join(tiles) + ")"
    r = em.assign(inst.name, f"tl.reduce({arg}, 1, {fn}, keep_dims=True)", em._comment(inst))
    if len(tiles) == 1:
        return r
    return tuple(em.assign(f"{inst.name}_{j}", f"{r}[{j}]") for j in range(len(tiles)))


def serial_dot(em: Emitter, inst: Instruction, idx: Index) -> str:
    lhs, rhs = inst.operands
    lb, rb, lc, rc, lf, rf = dot_dims(inst)
    K = math.prod(lhs.shape.dims[d] for d in lc)
    out = inst.shape.dtype
    acc_t = "tl.float32" if out.is_float else "tl.int64" if out.is_integer else tl_type(out)
    if out.name == "f64":
        acc_t = "tl.float64"
    acc = em.assign(f"acc_{inst.name}", f"tl.zeros([BLOCK], {acc_t})", f"accumulator of %{inst.name}")
    k = em.fresh("k")
    em.line(f"for {k} in range(0, {K}):", f"serial dot %{inst.name} over K={K}")
    em.push_scope()
    kk = em.delinearize(f"k_{inst.name}", k, [lhs.shape.dims[d] for d in lc])
    nb = len(lb)
    li = [""] * lhs.shape.rank
    ri = [""] * rhs.shape.rank
    for i, (a, b) in enumerate(zip(lb, rb)):
        li[a] = idx[i]
        ri[b] = idx[i]
    for j, d in enumerate(lf):
        li[d] = idx[nb + j]
    for j, d in enumerate(rf):
        ri[d] = idx[nb + len(lf) + j]
    for a, b, e in zip(lc, rc, kk):
        li[a] = e
        ri[b] = e
    av = em.value(lhs, tuple(li))
    bv = em.value(rhs, tuple(ri))
    em.line(f"{acc} += {av}.to({acc_t}) * {bv}.to({acc_t})")
    em.pop_scope()
    return em.assign(inst.name, f"{acc}.to({em.repr_type(out)})", f"%{inst.name} (dot)")


# --- loop template ----------------------------------------------------------------------------
def loop_template(em: Emitter, comp: Computation, big: bool, generic: bool = False) -> Plan:
    outs = outputs_of(comp)
    if not generic and flat_enabled() and not flat_reason(comp, outs):
        return flat_loop_template(em, outs, big)
    em.reduce_handler = lambda inst, idx: serial_reduce(em, inst, idx)
    em.dot_handler = lambda inst, idx: serial_dot(em, inst, idx)
    n_max = max(numel(o.shape) for o in outs)
    em.line("pid = tl.program_id(0)")
    em.line(f"offs = pid{'.to(tl.int64)' if big else ''} * BLOCK + tl.arange(0, BLOCK)",
            "flat indices of this program's output elements")
    if minor_tiles_enabled():
        em.tile_rows = "offs"    # every index here is a scalar or [BLOCK]: minor_tiles.py
    shared: dict[tuple, tuple] = {}
    for k, out in enumerate(outs):
        dims = out.shape.dims
        n = numel(out.shape)
        if dims not in shared:
            mask = em.assign("mask", f"offs < {n}")
            lin = em.fresh("lin")
            clamp_if(em, lin, "offs", n, "BLOCK")
            idx = tuple(em.delinearize("i", lin, dims))
            shared[dims] = (mask, idx)
        mask, idx = shared[dims]
        v = em.value(out, idx)
        _store(em, k, out, v, idx, mask, unit=unit_store_hint(em))
    block = min(1024, max(16, next_pow2(n_max)))
    if em.tiles_used:
        # A tile holds one row per thread and register tile, so a program's loads are its
        # rows: smaller blocks put more of them in flight across the SMs. Measured on the
        # H200 (GIOU f32[1024,256,4] x2, CUPTI, benchmarks/loop_configs.py): BLOCK 256 with
        # 2 warps (1024 programs) 2.43 µs, 512/4 2.62, 1024/4 2.72; XLA's kernel 2.50 with
        # 2048 blocks of 128 threads. So: halve the block while fewer than 1024 programs.
        while block > 256 and n_max // block < 1024:
            block //= 2
    if generic and any(i.opcode in ("reduce", "dot") for i in comp.instructions):
        block = min(block, 256)
    cfg = {"BLOCK": block, "num_warps": 4 if block >= 512 else 2, "num_stages": 1}
    cands = [dict(cfg, BLOCK=b, num_warps=w)
             for b, w in ((256, 2), (512, 4), (1024, 4), (2048, 8), (4096, 8))
             if b <= max(16, next_pow2(n_max))] or [cfg]
    return Plan("generic" if generic else "loop", ["BLOCK"], cfg,
                lambda c: (max(1, -(-n_max // c["BLOCK"])),), cands)


def flat_loop_template(em: Emitter, outs: list[Instruction], big: bool) -> Plan:
    """A purely elementwise fusion (``flat_loop.flat_reason``) over flat offsets: no dims in
    the source, the element count ``n`` a runtime argument, so fusions differing only in
    their shape share one kernel. Triton specializes ``n`` as it does any integer argument
    (16 divides it or not, equal to 1): that splits the compiles by class, not by size."""
    n = numel(outs[0].shape)
    wide = big or n + MAX_BLOCK > 2 ** 31 - 1      # offs runs a block past n
    em.line("pid = tl.program_id(0)")
    em.line(f"offs = pid{'.to(tl.int64)' if wide else ''} * BLOCK + tl.arange(0, BLOCK)",
            "flat offsets, in memory order, of this program's elements")
    em.line("mask = offs < n", "n: the element count, a launch argument")
    em.flat = ("offs", "mask")
    idx = tuple("offs" for _ in outs[0].shape.dims)   # no coordinates are read
    for k, out in enumerate(outs):
        v = em.value(out, idx)
        dt = tl_type(out.shape.dtype)
        em.line(f"tl.store(out{k} + offs, ({v}).to({dt}), mask=mask)", f"output {k}: %{out.name}")
    cfg = dict(FLAT_CONFIG if n > 1 else SCALAR_CONFIG)
    cands = [dict(cfg, BLOCK=b, num_warps=w)
             for b, w in ((256, 2), (512, 4), (1024, 4), (2048, 8), (4096, 8))
             if b <= max(16, next_pow2(n))] or [cfg]
    return Plan("loop", ["BLOCK"], cfg, lambda c: (max(1, -(-n // c["BLOCK"])),), cands,
                flat_n=n)


# --- transpose template -----------------------------------------------------------------------
def _physical_minor(shape: Shape) -> int:
    from hlo.layout_util import minor_dim
    return minor_dim(shape)


def _source_minor(v: Instruction) -> int | None:
    """The logical dim of ``v`` that is minor in memory where ``v`` is read from a fusion
    parameter (through converts), else None."""
    while v.opcode in ("convert", "bitcast-convert", "negate", "abs") and v.operands:
        if v.operands[0].shape.dims != v.shape.dims:
            return None
        v = v.operands[0]
    if v.opcode == "bitcast" and v.operands and v.operands[0].opcode == "parameter" \
            and v.shape.layout is not None:
        # A view of the parameter: the same bytes, so its own layout says what is minor.
        return _physical_minor(v.shape) if v.shape.rank else None
    return _physical_minor(v.shape) if v.opcode == "parameter" and v.shape.rank else None


def _reshape_kept_dim(reshape: Instruction, d: int) -> int | None:
    """The output dim of a (row-major index) reshape that is operand dim ``d`` unchanged
    (same size, same number of elements before it), or None."""
    src, dst = reshape.operands[0].shape.dims, reshape.shape.dims
    before = math.prod(src[:d])
    for j in range(len(dst)):
        if math.prod(dst[:j]) == before and dst[j] == src[d]:
            return j
    return None


def transpose_tile_dims(comp: Computation) -> tuple[int, int] | None:
    """(output's minor dim, the dim a transposed input is minor in), in the outputs' logical
    dims, when the fusion moves the minor dimension of a parameter (a layout-changing copy
    or a transpose): XLA's transpose hero. Such a fusion reads along one dim and writes
    along another, so a tile of both dims is read and written in 16-byte rows, the swap
    going through shared memory; the loop template would read or write one byte per
    transaction."""
    outs = outputs_of(comp)
    shape = outs[0].shape
    if shape.rank < 2 or any(o.shape.dims != shape.dims or not o.shape.is_array
                             or _physical_minor(o.shape) != _physical_minor(shape) for o in outs):
        return None
    a = _physical_minor(shape)
    for inst in comp.instructions:
        if inst.opcode not in ("copy", "transpose", "reshape") or inst.shape.dims != shape.dims:
            continue
        m_in = _source_minor(inst.operands[0])
        if m_in is None:
            continue
        if inst.opcode == "reshape":
            # A layout-changing reshape (an attention output in [b,h,d,s] read as
            # [b,s,h*d]): a transpose when the source's minor dim survives as an output dim.
            b = _reshape_kept_dim(inst, m_in)
            if b is None:
                continue
        else:
            b = m_in if inst.opcode == "copy" else list(inst.attrs.get("dimensions", ())).index(m_in)
        small = min(shape.dims[a], shape.dims[b])
        if b != a and (small >= 16 or (small >= 2 and math.prod(shape.dims) >= SMALL_DIM_TILED
                                       and max(shape.dims[a], shape.dims[b]) >= 16)):
            return a, b
    return None


# A transpose whose swapped dims include one under 16 (a [T, D, 8] mixture-of-experts
# dispatch re-laid out expert-major) is tiled from this many elements: as a loop kernel,
# each 32-byte sector it read served 2 of its 16 elements (0.59 ms for 64 MB on the H200).
# Below it the loop kernel costs less than the tile's shared-memory round trip.
SMALL_DIM_TILED = 1 << 20


def transpose_template(em: Emitter, comp: Computation, big: bool) -> Plan:
    """Tiles of [BLOCK_B, BLOCK_A] over the two dims ``transpose_tile_dims`` names, one
    program per tile and per index of the other dims."""
    dims_ab = transpose_tile_dims(comp)
    if dims_ab is None:
        raise NotTileable("no transposed parameter to tile")
    a, b = dims_ab
    outs = outputs_of(comp)
    dims = outs[0].shape.dims
    others = [d for d in range(len(dims)) if d not in (a, b)]
    batch = math.prod(dims[d] for d in others)
    if batch > 65535:
        raise NotTileable(f"{batch} tiles of the other dims exceed the grid's second axis")
    na, nb = dims[a], dims[b]
    em.line("pid = tl.program_id(0)")
    em.line("pid_o = tl.program_id(1)", f"index over the other dims ({batch})")
    em.line(f"tiles_b = tl.cdiv({nb}, BLOCK_B)")
    cast = ".to(tl.int64)" if big else ""
    em.line(f"ia = (pid // tiles_b){cast} * BLOCK_A + tl.arange(0, BLOCK_A)[None, :]",
            f"dim {a}: minor in the output")
    em.line(f"ib = (pid % tiles_b){cast} * BLOCK_B + tl.arange(0, BLOCK_B)[:, None]",
            f"dim {b}: minor in the transposed input")
    clamp_if(em, "ia_c", "ia", na, "BLOCK_A")
    clamp_if(em, "ib_c", "ib", nb, "BLOCK_B")
    rest = em.delinearize("o", f"pid_o{cast}", [dims[d] for d in others]) if others else []
    idx = [""] * len(dims)
    idx[a], idx[b] = "ia_c", "ib_c"
    for d, e in zip(others, rest):
        idx[d] = e
    mask = em.assign("mask", f"(ia < {na}) & (ib < {nb})")
    for k, out in enumerate(outs):
        _store(em, k, out, em.value(out, tuple(idx)), tuple(idx), mask)
    width = max(o.shape.dtype.bits for o in outs)
    tile = 128 if width <= 8 else 64
    cfg = {"BLOCK_A": tile, "BLOCK_B": tile, "num_warps": 8 if tile == 128 else 4,
           "num_stages": 1}
    cands = [cfg] + [dict(cfg, BLOCK_A=t, BLOCK_B=t, num_warps=w)
                     for t, w in ((32, 2), (64, 4), (64, 8), (128, 8), (128, 4))
                     if (t, w) != (tile, cfg["num_warps"])]
    if min(na, nb) < 16:
        # One side whole (its dim padded to a power of two), the other long enough for
        # ~1024 elements a tile: each tile reads and writes whole runs of both orders.
        short = next_pow2(min(na, nb))
        long_ = max(16, min(512, 1024 // short))
        ba, bb = (short, long_) if na < nb else (long_, short)
        cfg = {"BLOCK_A": ba, "BLOCK_B": bb, "num_warps": 4, "num_stages": 1}
        cands = [cfg, dict(cfg, num_warps=2)]
    grid = lambda c: (-(-na // c["BLOCK_A"]) * -(-nb // c["BLOCK_B"]), batch)  # noqa: E731
    return Plan("transpose", ["BLOCK_A", "BLOCK_B"], cfg, grid, cands)


# --- row/column reduction and normalization template -------------------------------------------
# A row whose input is at most this many bytes is one tile (one load, registers): bf16 rows
# up to 32K, f32 up to 16K. The 8192x32000 bf16 cross-entropy row as one 32768 tile ran at
# 0.50x XLA against 0.84x looped in 4096-wide passes (H200, benchmarks/NOTES.md issue 14).
# (The legacy rule: reductions.rows_template, the default now, tiles rows wider than 4096
# only when a looped kernel would read them more than once.)
ROW_TILE_BYTES = 65536
MAX_ROW_TILE = 32768


def row_tile_limit(comp: Computation, full_dims: tuple) -> int:
    """Largest power-of-two row tile for ``comp``'s reduction: ROW_TILE_BYTES of its
    widest full-shaped parameter (16K when no parameter is read at full shape)."""
    widths = [p.shape.dtype.bits // 8 for p in comp.parameters
              if p.shape.is_array and math.prod(p.shape.dims) == math.prod(full_dims)]
    if not widths:
        return 16384
    return max(16384 // 4, min(MAX_ROW_TILE, ROW_TILE_BYTES // max(1, max(widths))))


def rows_template(em: Emitter, comp: Computation, big: bool,
                  max_row_block: Optional[int] = None) -> Plan:
    outs = outputs_of(comp)
    reduces = [i for i in comp.instructions if i.opcode == "reduce"]
    if not reduces:
        raise NotTileable("no reduce")
    first = reduces[0]
    full_dims = first.operands[0].shape.dims
    red_dims = sorted(first.attrs["dimensions"])
    for r in reduces:
        if r.operands[0].shape.dims != full_dims or sorted(r.attrs["dimensions"]) != red_dims:
            raise NotTileable("reduces over different shapes or dimensions")
    kept_dims = [d for d in range(len(full_dims)) if d not in red_dims]
    kept_shape = tuple(full_dims[d] for d in kept_dims)
    for o in outs:
        if o.shape.dims not in (full_dims, kept_shape):
            raise NotTileable(f"output %{o.name} is neither the reduced nor the full shape")
    M = math.prod(kept_shape)
    R = math.prod(full_dims[d] for d in red_dims)
    layout = first.operands[0].shape.layout
    minor = layout.minor_to_major[0] if layout is not None and layout.minor_to_major else len(full_dims) - 1
    column = minor in kept_dims and M > 1
    if max_row_block is None:
        max_row_block = row_tile_limit(comp, full_dims)
    single = (not column) and next_pow2(R) <= max_row_block
    if column:
        # Each program owns BM adjacent kept elements (contiguous: coalesced loads) and walks
        # the reduced dim BN rows at a time. Few kept elements per program so that the grid
        # fills the GPU (~2 programs per SM of a 132-SM Hopper), at least 128 bytes wide;
        # tiles of ~8K elements keep enough loads in flight per SM.
        # At least one 32-byte sector per row of the tile: DRAM is read in sectors, so a
        # narrower tile wastes bandwidth, and a wider one leaves too few programs for
        # [2048, 1000]-sized reductions (32 programs of 128 bytes measured 33 µs on the
        # H200 where 125 of 32 bytes fill the GPU; benchmarks/NOTES.md run 12).
        width = max(1, 32 // max(1, first.operands[0].shape.dtype.bits // 8))
        BM = min(next_pow2(M), 128, max(width, prev_pow2(max(1, M // COLUMN_PROGRAMS))))
        BN = max(16, min(next_pow2(R), 8192 // BM))
    elif single:
        BN = next_pow2(R)
        BM = max(1, min(next_pow2(M), 4096 // BN if BN <= 4096 else 1))
    else:
        BM, BN = 1, 4096
    if column:
        warps = 8 if BM * BN >= 8192 else 4
    elif single:
        warps = row_tile_warps(BM * BN)
    else:
        warps = max(1, min(16, (BM * BN) // 1024))

    em.line("pid = tl.program_id(0)")
    em.line(f"rows = pid{'.to(tl.int64)' if big else ''} * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]",
            f"{M} kept elements, BLOCK_M per program")
    em.line(f"row_mask = rows < {M}")
    clamp_if(em, "rows_c", "rows", M, "BLOCK_M")
    kept = em.delinearize("r", "rows_c", list(kept_shape))
    kept_idx = tuple(kept)

    def columns(start: str) -> tuple[str, Index]:
        em.line(f"cols = {start}tl.arange(0, BLOCK_N)[None, :]")
        cmask = "col_mask"
        em.line(f"{cmask} = cols < {R}")
        clamp_if(em, "cols_c", "cols", R, "BLOCK_N")
        red = em.delinearize("c", "cols_c", [full_dims[d] for d in red_dims])
        return cmask, _merge(kept_dims, kept_idx, red_dims, red)

    def masked(v: str, init: str, need: bool) -> str:
        return f"tl.where(col_mask, {v}, {init})" if need else f"({v} + tl.zeros([BLOCK_M, BLOCK_N], {v}.dtype))"

    need_mask = single and R != BN or not single and R % BN != 0

    def tile_reduce(inst: Instruction, idx: Index, full: Index) -> object:
        operands, inits = _reduce_parts(inst)
        ivs = [em.value(i, ()) for i in inits]
        vals = [em.value(o, full) for o in operands]
        sum_ = len(operands) == 1 and is_sum_reducer(inst.attrs["to_apply"])
        # A sum pads with 0 and adds the init once at the end; other reducers pad with the
        # init (exact when it is the identity or the reducer is idempotent: max/min/and/or).
        tiles = [em.assign(f"x_{inst.name}", masked(v, "0" if sum_ else iv, need_mask))
                 for v, iv in zip(vals, ivs)]
        return tiles, ivs

    if single:
        cmask, full_idx = columns("")

        def handler(inst: Instruction, idx: Index) -> object:
            if tuple(idx) != kept_idx:
                raise NotTileable("reduce read at a non-row index")
            tiles, ivs = tile_reduce(inst, idx, full_idx)
            return reduce_tile_rows(em, inst, tiles, ivs)
        em.reduce_handler = handler
        for k, o in enumerate(outs):
            if o.shape.dims == full_dims and len(full_dims) != len(kept_shape):
                _store(em, k, o, em.value(o, full_idx), full_idx, f"row_mask & {cmask}")
            else:
                _store(em, k, o, em.value(o, kept_idx), kept_idx, "row_mask")
    else:
        full_outs = [(k, o) for k, o in enumerate(outs)
                     if o.shape.dims == full_dims and len(full_dims) != len(kept_shape)]
        # Full-shape outputs that need no reduction's result (a multi-output fusion's
        # elementwise roots beside its reduce) are stored from the first reduction's pass
        # over the input, so the input is read once, not twice.
        early = [(k, o) for k, o in full_outs if not o.reads_any(("reduce",))]
        stored_early: list[bool] = []

        def handler(inst: Instruction, idx: Index) -> object:
            if tuple(idx) != kept_idx or len(em.scopes) != 1:
                raise NotTileable("reduce read at a non-row index or inside a loop")
            operands, inits = _reduce_parts(inst)
            sum_ = len(operands) == 1 and is_sum_reducer(inst.attrs["to_apply"])
            fn = None if sum_ else combine_fn(em, inst.attrs["to_apply"])
            ivs = [em.value(i, ()) for i in inits]
            accs = []
            for o, iv in zip(inits, ivs):
                dt = "tl.float32" if sum_ and is_narrow_float(o.shape.dtype) else em.repr_type(o.shape.dtype)
                start = "" if sum_ else f" + {iv}"
                accs.append(em.assign(f"acc_{inst.name}", f"tl.zeros([BLOCK_M, BLOCK_N], {dt}){start}"))
            em.line(f"for c0 in range(0, {R}, BLOCK_N):", f"pass over the row for %{inst.name}")
            em.push_scope()
            _, full = columns("c0 + ")
            vals = [em.value(o, full) for o in operands]
            tiles = [em.assign(f"x_{inst.name}", masked(v, "0" if sum_ else iv, need_mask))
                     for v, iv in zip(vals, ivs)]
            if sum_:
                em.line(f"{accs[0]} += {tiles[0]}.to({accs[0]}.dtype)")
            else:
                new = em.assign("c", f"{fn}({', '.join(accs + tiles)})")
                for j, a in enumerate(accs):
                    em.line(f"{a} = {new}" if len(accs) == 1 else f"{a} = {new}[{j}]")
            if early and not stored_early:
                for k, o in early:
                    _store(em, k, o, em.value(o, full), full, "row_mask & col_mask")
                stored_early.append(True)
            em.pop_scope()
            dt = inst.shape.dtype if len(accs) == 1 else None
            if sum_:
                return em.assign(inst.name, f"(tl.sum({accs[0]}, axis=1, keep_dims=True) + {ivs[0]})"
                                            f".to({em.repr_type(dt)})", em._comment(inst))
            arg = accs[0] if len(accs) == 1 else "(" + ", ".join(accs) + ")"
            r = em.assign(inst.name, f"tl.reduce({arg}, 1, {fn}, keep_dims=True)", em._comment(inst))
            if len(accs) == 1:
                return r
            return tuple(em.assign(f"{inst.name}_{j}", f"{r}[{j}]") for j in range(len(accs)))
        em.reduce_handler = handler
        # Every reduction first (each its own pass over the row), then the outputs.
        for r in reduces:
            em.value(r, kept_idx)
        for k, o in enumerate(outs):
            if (k, o) not in full_outs:
                _store(em, k, o, em.value(o, kept_idx), kept_idx, "row_mask")
        full_outs = [ko for ko in full_outs if not (stored_early and ko in early)]
        if full_outs:
            em.line(f"for c0 in range(0, {R}, BLOCK_N):", "output pass over the row")
            em.push_scope()
            _, full = columns("c0 + ")
            for k, o in full_outs:
                _store(em, k, o, em.value(o, full), full, "row_mask & col_mask")
            em.pop_scope()

    cfg = {"BLOCK_M": BM, "BLOCK_N": BN, "num_warps": warps, "num_stages": 1}
    cands = [cfg]
    if single and not column:
        for bm in (1, 2, 4, 8):
            for w in (4, 8, 16):
                if bm <= next_pow2(M) and bm * BN <= 32768 and (bm, w) != (BM, warps):
                    cands.append(dict(cfg, BLOCK_M=bm, num_warps=w))
    elif column:
        cands += [dict(cfg, BLOCK_M=bm, BLOCK_N=bn, num_warps=w)
                  for bm, bn, w in ((32, 128, 4), (32, 256, 8), (64, 128, 8), (128, 32, 4),
                                    (16, 512, 8)) if bm <= max(16, next_pow2(M))
                  and (bm, bn, w) != (BM, BN, warps)]
    name = "column_reduction" if column else ("normalization" if single else "looped_rows")
    return Plan(name, ["BLOCK_M", "BLOCK_N"], cfg, lambda c: (max(1, -(-M // c["BLOCK_M"])),), cands)


# --- GEMM template ----------------------------------------------------------------------------
def gemm_template(em: Emitter, comp: Computation, big: bool) -> Plan:
    dots = [i for i in comp.instructions if i.opcode == "dot"]
    if len(dots) != 1 or any(i.opcode == "reduce" for i in comp.instructions):
        raise NotTileable("GEMM template wants exactly one dot and no reduce")
    dot = dots[0]
    outs = outputs_of(comp)
    lhs, rhs = dot.operands
    lb, rb, lc, rc, lf, rf = dot_dims(dot)
    if len(lc) != 1 or len(lf) != 1 or len(rf) != 1:
        raise NotTileable("GEMM template wants one contracting and one free dim per side")
    for o in outs:
        if o.shape.dims != dot.shape.dims:
            raise NotTileable("an output does not have the dot's shape")
    nb = len(lb)
    batch_dims = dot.shape.dims[:nb]
    B = math.prod(batch_dims)
    M, N = dot.shape.dims[nb], dot.shape.dims[nb + 1]
    K = lhs.shape.dims[lc[0]]
    ldt, rdt, odt = lhs.shape.dtype, rhs.shape.dtype, dot.shape.dtype
    int_dot = ldt.name in ("s8", "u8") and rdt.name in ("s8", "u8") and odt.is_integer
    if int_dot:
        op_t, acc_t = "tl.int8", "tl.int32"
    elif ldt == rdt and is_narrow_float(ldt):
        op_t, acc_t = tl_type(ldt), "tl.float32"
    elif ldt.is_float and rdt.is_float and ldt.bits <= 32 and rdt.bits <= 32:
        op_t, acc_t = "tl.float32", "tl.float32"
    else:
        raise NotTileable(f"dot of {ldt.name} x {rdt.name}")
    if op_t in ("tl.bfloat16", "tl.float16") and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        # Triton's interpreter (3.9) returns garbage for bf16 tl.dot: widen there (tests only;
        # the values are exact in f32, so the result is the same).
        op_t = "tl.float32"
    prec = dot.attrs.get("operand_precision") or ()
    ieee = any(str(p).lower() == "highest" for p in prec)
    dot_kw = ", out_dtype=tl.int32" if int_dot else (
        f", input_precision=\"{'ieee' if ieee else 'tf32'}\"" if op_t == "tl.float32" else "")

    small = max(M, N) <= 64
    BM = min(128, max(16, next_pow2(M)))
    BN = min(128, max(16, next_pow2(N)))
    # 8-bit tiles: 128 bytes of K per row, as the tensor cores' 8-bit MMAs read them.
    BK = min(128 if int_dot else 64, max(16, next_pow2(K)))
    warps, stages = (8, 3) if BM * BN >= 128 * 128 else (4, 3)
    if small:
        warps = 4
    em.line("pid = tl.program_id(0)")
    em.line("pid_b = tl.program_id(1)", f"batch index over {B}")
    em.line(f"num_pid_m = tl.cdiv({M}, BLOCK_M)")
    em.line(f"num_pid_n = tl.cdiv({N}, BLOCK_N)")
    em.line("group = GROUP_M * num_pid_n", "grouped order: programs sharing A rows run together (L2)")
    em.line("first_m = (pid // group) * GROUP_M")
    em.line("group_m = tl.minimum(num_pid_m - first_m, GROUP_M)")
    em.line("pid_m = first_m + (pid % group) % group_m")
    em.line("pid_n = (pid % group) // group_m")
    bidx = em.delinearize("b", "pid_b", list(batch_dims)) if nb else []
    em.line(f"rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]")
    em.line(f"rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]")
    clamp_if(em, "rm_c", "rm", M, "BLOCK_M")
    clamp_if(em, "rn_c", "rn", N, "BLOCK_N")
    em.line(f"acc = tl.zeros([BLOCK_M, BLOCK_N], {acc_t})")
    em.line(f"for k0 in range(0, {K}, BLOCK_K):", f"K = {K}")
    em.push_scope()
    em.line("ka = k0 + tl.arange(0, BLOCK_K)[None, :]")
    em.line("kb = k0 + tl.arange(0, BLOCK_K)[:, None]")
    k_tail = K % BK != 0
    if k_tail:
        em.line(f"ka_c = tl.minimum(ka, {K - 1})")
        em.line(f"kb_c = tl.minimum(kb, {K - 1})")
    ka, kb = ("ka_c", "kb_c") if k_tail else ("ka", "kb")
    li = [""] * lhs.shape.rank
    ri = [""] * rhs.shape.rank
    for i, (a, b) in enumerate(zip(lb, rb)):
        li[a] = bidx[i]
        ri[b] = bidx[i]
    li[lf[0]], ri[rf[0]] = "rm_c", "rn_c"
    li[lc[0]], ri[rc[0]] = ka, kb
    av = em.value(lhs, tuple(li))
    bv = em.value(rhs, tuple(ri))
    a = em.assign("a", f"tl.broadcast_to({av}, [BLOCK_M, BLOCK_K]).to({op_t})", "A tile (prologue applied)")
    b = em.assign("b", f"tl.broadcast_to({bv}, [BLOCK_K, BLOCK_N]).to({op_t})", "B tile (prologue applied)")
    if k_tail:
        em.line(f"{a} = tl.where(ka < {K}, {a}, 0)")
        em.line(f"{b} = tl.where(kb < {K}, {b}, 0)")
    em.line(f"acc = tl.dot({a}, {b}, acc{dot_kw})", em._comment(dot))
    em.pop_scope()
    out_idx = tuple(bidx) + ("rm_c", "rn_c")
    dval = em.assign(dot.name, f"acc.to({em.repr_type(odt)})", "the dot's result tile")
    em.bind(dot, out_idx, dval, outer=True)

    def handler(inst: Instruction, idx: Index) -> object:
        raise NotTileable("the dot is read at an index other than its output tile")
    em.dot_handler = handler
    em.reduce_handler = None
    for k, o in enumerate(outs):
        _store(em, k, o, em.value(o, out_idx), out_idx, f"(rm < {M}) & (rn < {N})")
    cfg = {"BLOCK_M": BM, "BLOCK_N": BN, "BLOCK_K": BK, "GROUP_M": 8,
           "num_warps": warps, "num_stages": stages}
    cands = [cfg]
    if not small:
        tiles = (((128, 256, 128, 8, 3), (256, 128, 128, 8, 3), (128, 128, 128, 8, 4),
                  (128, 128, 128, 4, 4), (128, 256, 64, 8, 4), (64, 128, 128, 4, 4))
                 if int_dot else
                 ((128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4),
                  (64, 128, 64, 4, 4), (128, 128, 128, 8, 3), (128, 64, 64, 4, 4)))
        for bm, bn, bk, w, s in tiles:
            c = dict(cfg, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=s)
            if c != cfg:
                cands.append(c)
    grid = lambda c: (-(-M // c["BLOCK_M"]) * -(-N // c["BLOCK_N"]), B)  # noqa: E731
    return Plan("gemm", ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"], cfg, grid, cands)

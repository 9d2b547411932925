"""The SPMD partitioner: one sharded module -> the program every device runs.

Each instruction (shardings filled in by ``sharding-propagation``) becomes instructions on
local shapes: the piece of each array one device holds. Values carry a ``Tiling`` (which
device holds which tile, and whether the tile is still a partial sum). Where what a value
is and what its user needs differ, ``reshard`` inserts the communication, cheapest first:

- a partial sum -> ``reduce-scatter`` when that lands on the wanted split, else
  ``all-reduce`` (XLA's partial results after a dot whose contracting dim is split);
- same tile grid, other devices -> ``collective-permute``;
- a dim split the user does not want -> ``all-to-all`` onto the dim it wants split, or
  ``all-gather`` of that dim (its padding sliced off when the split was uneven);
- a dim the user wants split further -> ``dynamic-slice`` at offsets looked up by
  ``partition-id`` (no communication; padded first when the split is uneven).

A dimension that does not divide by its tile count is padded (``tiling.py``): every
device holds ceil(n / t) elements. The rules that mix elements along a dimension mask the
padding first: a reduction replaces it with its init value, a dot contracting a padded
dimension with zeros, a gather sliced on one by an out-of-range test.

The rule for each op lives in a table (``HANDLERS``: ``handlers.py`` for the arithmetic
ops, ``indexing.py`` for gather/scatter, ``control.py`` for while loops and manual
computations); ops without one run on whole (replicated) operands, which is always
correct. Collectives carry ``channel_id`` and ``use_global_device_ids`` with replica groups
of partition ids, printed in iota form when they are one (XLA's spelling).
"""
from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from hlo import dtypes as dt
from hlo.attrs import PadDim, PaddingConfig
from hlo.ir import Computation, Instruction, Module
from hlo.sharding import Sharding
from hlo.shape import Layout, Shape, TupleShape

from ..base import register_pass
from . import rules
from .propagation import manual_region, num_devices
from .tiling import SpmdError, Tiling, layered_groups, replica_groups

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
MANUAL = "manual"        # the tiling of a value inside a manual computation (shard_map)


def local_shape(like: Shape, dims: Sequence[int], dtype: Optional[dt.DType] = None) -> Shape:
    """An array shape of ``dims`` (row-major), of ``like``'s element type or ``dtype``."""
    return Shape(dtype or like.dtype, tuple(dims), Layout.row_major(len(dims)))


def _bytes(shape: Shape, dims: Sequence[int]) -> int:
    return math.prod(dims) * shape.dtype.itemsize


@dataclass
class Value:
    """A partitioned value: the instruction holding this device's piece, how the global
    array is tiled (a Tiling; a tuple of Values for a tuple; MANUAL inside a manual
    computation; None for a token) and the global (unpartitioned) shape."""
    inst: Instruction
    tiling: Any
    global_shape: Any


Handler = Callable[["Partitioner", Instruction], Value]
HANDLERS: dict[str, Handler] = {}


def handler(*opcodes: str) -> Callable[[Handler], Handler]:
    """Register the partitioning rule of ``opcodes``."""
    def register(fn: Handler) -> Handler:
        for op in opcodes:
            HANDLERS[op] = fn
        return fn
    return register


class Partitioner:
    def __init__(self, module: Module, n: int):
        self.module = module
        self.n = n
        old = module.entry
        assert old is not None
        self.old = old
        self.channels = itertools.count(_max_channel_id(module) + 1)
        self._adders: dict[str, Computation] = {}
        self.emit = True
        self.cost = 0
        self.manual: set[int] = set()
        # The computation being written, the values of the one being read, partition-id.
        self.comp = Computation(module.unique_computation_name(old.name + "_spmd"))
        self.vals: dict[int, Value] = {}
        self.reshards: dict[tuple, Instruction] = {}
        self._pid: Optional[Instruction] = None

    @contextlib.contextmanager
    def scope(self, comp: Computation) -> Iterator[None]:
        """Emit into ``comp`` (a loop body or condition), with values of its own."""
        saved = (self.comp, self.vals, self.reshards, self._pid)
        self.comp, self.vals, self.reshards, self._pid = comp, {}, {}, None
        try:
            yield
        finally:
            self.comp, self.vals, self.reshards, self._pid = saved

    # --- emitting ---------------------------------------------------------------------
    def add(self, opcode: str, operands: Sequence[Instruction], shape: Any,
            attrs: Optional[dict] = None, literal: Any = None, name: Optional[str] = None,
            parameter_number: Optional[int] = None) -> Instruction:
        inst = Instruction(opcode, list(operands), shape, attrs or {}, literal=literal,
                           parameter_number=parameter_number)
        return self.comp.add_instruction(inst, name=name)

    def scalar(self, value: Any, dtype: dt.DType) -> Instruction:
        return self.add("constant", [], Shape(dtype, ()),
                        literal=np.asarray(value, dtype.np_dtype))

    def broadcast(self, scalar: Instruction, dims: Sequence[int]) -> Instruction:
        return self.add("broadcast", [scalar], local_shape(scalar.shape, dims),
                        {"dimensions": ()})

    def partition_id(self) -> Instruction:
        if self._pid is None:
            self._pid = self.add("partition-id", [], Shape(dt.U32, ()))
        return self._pid

    def per_device_scalar(self, values: Sequence[int], dtype: dt.DType = dt.S32) -> Instruction:
        """A scalar holding ``values[partition-id]`` (XLA's table lookup)."""
        if len(set(values)) == 1:
            return self.scalar(values[0], dtype)
        table = self.add("constant", [], local_shape(Shape(dtype), (self.n,)),
                         literal=np.asarray(values, dtype.np_dtype))
        one = self.add("dynamic-slice", [table, self.partition_id()],
                       local_shape(table.shape, (1,)), {"dynamic_slice_sizes": (1,)})
        return self.add("reshape", [one], Shape(dtype, ()))

    def adder(self, dtype: dt.DType) -> Computation:
        if dtype.name not in self._adders:
            c = Computation(self.module.unique_computation_name(f"add.{dtype.name}"))
            s = Shape(dtype, ())
            self.module.add_computation(c)
            x = c.add_instruction(Instruction("parameter", [], s, parameter_number=0), "x")
            y = c.add_instruction(Instruction("parameter", [], s, parameter_number=1), "y")
            c.root = c.add_instruction(Instruction("add", [x, y], s), "add")
            self.module.computations.remove(c)
            self.module.computations.insert(0, c)
            self._adders[dtype.name] = c
        return self._adders[dtype.name]

    def collective(self, opcode: str, x: Instruction, shape: Shape, groups: list[list[int]],
                   in_dims: Sequence[int], **attrs: Any) -> Optional[Instruction]:
        nbytes = max(_bytes(shape, shape.dims), _bytes(shape, in_dims))
        self.cost += nbytes
        if not self.emit:
            return None
        a: dict[str, Any] = {"channel_id": next(self.channels)}
        if opcode == "collective-permute":
            a["source_target_pairs"] = attrs.pop("pairs")
        else:
            a["replica_groups"] = replica_groups(groups)
        if opcode in ("all-reduce", "all-gather", "reduce-scatter"):
            a["use_global_device_ids"] = True
        if "dimensions" in attrs:
            a["dimensions"] = attrs.pop("dimensions")
        if "to_apply" in attrs:
            a["to_apply"] = attrs.pop("to_apply")
        return self.add(opcode, [x], shape, a)

    # --- padding ----------------------------------------------------------------------
    def valid_mask(self, t: Tiling, g: Shape, dims: Sequence[int]) -> Optional[Instruction]:
        """pred[local dims]: true on real elements, false on the padding of ``dims``; None
        when none of ``dims`` is padded."""
        padded = [d for d in t.padded_dims(g.dims) if d in dims]
        if not padded or not self.emit:
            return None
        loc = t.local_dims(g.dims)
        mask = None
        for d in padded:
            limit = self.broadcast(self.per_device_scalar(t.valid_counts(g.dims, d)), loc)
            iota = self.add("iota", [], local_shape(g, loc, dt.S32), {"iota_dimension": d})
            m = self.add("compare", [iota, limit], local_shape(g, loc, dt.PRED),
                         {"direction": "LT"})
            mask = m if mask is None else self.add("and", [mask, m], m.shape)
        return mask

    def mask_padding(self, x: Instruction, t: Tiling, g: Shape, dims: Sequence[int],
                     fill: Instruction) -> Instruction:
        """``x`` with the padding of ``dims`` replaced by the scalar ``fill``."""
        mask = self.valid_mask(t, g, dims)
        if mask is None:
            return x
        return self.add("select", [mask, x, self.broadcast(fill, x.shape.dims)], x.shape)

    # --- resharding -------------------------------------------------------------------
    def local(self, t: Tiling, g: Shape) -> tuple[int, ...]:
        return t.local_dims(g.dims)

    def reshard(self, x: Optional[Instruction], src: Tiling, dst: Tiling, g: Shape
                ) -> Optional[Instruction]:
        """``x`` (split as ``src``) split as ``dst``; emits nothing in planning mode."""
        if src.partial is not None:
            x, src = self._resolve_partial(x, src, dst, g)
        if src.same_as(dst):
            return x
        if src.tiles == dst.tiles:
            y = self._permute(x, src, dst, g)
            if y is not False:
                return y
        x, src = self._all_to_all(x, src, dst, g)
        for i in range(src.rank):
            if not _compatible(src, dst, i, g.dims[i]):
                x, src = self._all_gather(x, src, i, g)
        if not src.same_as(dst):
            x = self._slice(x, src, dst, g)
        return x

    def _resolve_partial(self, x, src: Tiling, dst: Tiling, g: Shape):
        groups = layered_groups(src.index, src.partial)
        p = len(groups[0])
        rank_of = {d: r for grp in groups for r, d in enumerate(grp)}
        loc = self.local(src, g)
        for j in range(src.rank):
            if loc[j] % p or g.dims[j] % (src.tiles[j] * p):
                continue
            tiles = list(src.tiles)
            tiles[j] *= p
            index = [tuple(ix[k] * p + rank_of[d] if k == j else ix[k] for k in range(src.rank))
                     for d, ix in enumerate(src.index)]
            new = Tiling(tuple(tiles), tuple(index))
            if all(_compatible(new, dst, i, g.dims[i]) for i in range(src.rank)):
                dims = list(loc)
                dims[j] //= p
                y = self.collective("reduce-scatter", x, local_shape(g, dims), groups, loc,
                                    dimensions=(j,), to_apply=src.reducer)
                return y, new
        y = self.collective("all-reduce", x, local_shape(g, loc), groups, loc,
                            to_apply=src.reducer)
        return y, src.without_partial()

    def _permute(self, x, src: Tiling, dst: Tiling, g: Shape):
        holders: dict[tuple, list[int]] = {}
        for d, ix in enumerate(src.index):
            holders.setdefault(ix, []).append(d)
        pairs, used = [], set()
        for d, ix in enumerate(dst.index):
            cands = [s for s in holders[ix] if s not in used]
            if d in cands:
                s = d
            elif cands:
                s = cands[0]
            else:
                return False   # a source would send twice: not one permute
            used.add(s)
            pairs.append((s, d))
        loc = self.local(src, g)
        return self.collective("collective-permute", x, local_shape(g, loc), [], loc,
                               pairs=tuple(sorted(pairs)))

    def _all_to_all(self, x, src: Tiling, dst: Tiling, g: Shape):
        """Move a split from dim i (which dst keeps whole) to dim j (which src keeps whole)
        with one all-to-all when dst's split of j is src's split of i, device by device.
        Both dims must divide evenly (padding would land in the middle of a piece)."""
        for i, j in itertools.permutations(range(src.rank), 2):
            if not (src.tiles[i] > 1 and dst.tiles[i] == 1 and src.tiles[j] == 1
                    and dst.tiles[j] == src.tiles[i]):
                continue
            if g.dims[i] % src.tiles[i] or g.dims[j] % src.tiles[i]:
                continue
            if any(s[i] != d[j] for s, d in zip(src.index, dst.index)):
                continue
            tiles = list(src.tiles)
            tiles[i], tiles[j] = 1, src.tiles[i]
            index = []
            for ix in src.index:
                ix = list(ix)
                ix[i], ix[j] = 0, ix[i]
                index.append(tuple(ix))
            new = Tiling(tuple(tiles), tuple(index))
            if not all(_compatible(new, dst, k, g.dims[k]) for k in range(src.rank)):
                continue
            loc = list(self.local(src, g))
            keys = [ix[:i] + ix[i + 1:] for ix in src.index]
            groups = layered_groups(keys, [ix[i] for ix in src.index])
            y = self._emit_all_to_all(x, loc, i, j, src.tiles[i], groups, g)
            return y, new
        return x, src

    def _emit_all_to_all(self, x, loc: list[int], i: int, j: int, p: int, groups, g: Shape):
        # Split dim j into (p, loc[j]/p), exchange along the new major part, then put the
        # received pieces (ordered by sender, i.e. by tile of dim i) next to dim i.
        split = loc[:j] + [p, loc[j] // p] + loc[j + 1:]
        out_loc = list(loc)
        out_loc[i] *= p
        out_loc[j] //= p
        self.cost += _bytes(g, loc)
        if not self.emit:
            return None
        r = self.add("reshape", [x], local_shape(g, split))
        a2a = self.add("all-to-all", [r], local_shape(g, split),
                       {"channel_id": next(self.channels), "replica_groups": replica_groups(groups),
                        "dimensions": (j,)})
        # dims of a2a: the original dims with j -> (j: sender, j+1: rest of j). The
        # sender is the tile of dim i, so it goes just before (major to) dim i.
        pos_i = i if i < j else i + 1
        order = [k for k in range(len(split)) if k != j]
        order.insert(order.index(pos_i), j)
        tdims = [split[k] for k in order]
        t = self.add("transpose", [a2a], local_shape(g, tdims), {"dimensions": tuple(order)})
        return self.add("reshape", [t], local_shape(g, out_loc))

    def _all_gather(self, x, src: Tiling, i: int, g: Shape):
        keys = [ix[:i] + ix[i + 1:] for ix in src.index]
        groups = layered_groups(keys, [ix[i] for ix in src.index])
        new = src.replicate_dims([i])
        loc = list(self.local(src, g))
        gathered = list(loc)
        gathered[i] *= src.tiles[i]
        y = self.collective("all-gather", x, local_shape(g, gathered), groups, loc,
                            dimensions=(i,))
        if gathered[i] != g.dims[i] and self.emit:      # padding at the end: slice it off
            from hlo.attrs import SliceDim, SliceSpec
            whole = list(gathered)
            whole[i] = g.dims[i]
            y = self.add("slice", [y], local_shape(g, whole), {"slice": SliceSpec(tuple(
                SliceDim(0, n) for n in whole))})
        return y, new

    def _slice(self, x, src: Tiling, dst: Tiling, g: Shape):
        dloc = self.local(dst, g)
        if not self.emit:
            return None
        sloc = self.local(src, g)
        # A whole dim split unevenly: pad it to tiles * piece first, so every device's
        # dynamic-slice stays in bounds (it would be clamped back otherwise).
        pads = [dst.tiles[i] * dloc[i] - sloc[i] if src.tiles[i] == 1 else 0
                for i in range(dst.rank)]
        if any(pads):
            zero = self.scalar(0, g.dtype)
            padded = [s + p for s, p in zip(sloc, pads)]
            x = self.add("pad", [x, zero], local_shape(g, padded), {"padding": PaddingConfig(
                tuple(PadDim(0, p) for p in pads))})
        starts = []
        for i in range(dst.rank):
            offs = [d[i] * dloc[i] - s[i] * sloc[i] for s, d in zip(src.index, dst.index)]
            starts.append(self.per_device_scalar(offs))
        return self.add("dynamic-slice", [x] + starts, local_shape(g, dloc),
                        {"dynamic_slice_sizes": tuple(dloc)})

    def plan_cost(self, src: Tiling, dst: Tiling, g: Shape) -> int:
        emit, cost = self.emit, self.cost
        self.emit, self.cost = False, 0
        try:
            self.reshard(None, src, dst, g)
            return self.cost
        except SpmdError:
            return 1 << 60
        finally:
            self.emit, self.cost = emit, cost

    def place(self, inst: Instruction, cands: Sequence[tuple[Optional[Tiling], ...]],
              result_of: Callable[..., Optional[Tiling]]) -> Optional[tuple]:
        """The cheapest placement of ``inst``'s first operands: among ``cands`` (a tiling per
        operand), those ``result_of(*tilings)`` gives a local result tiling for, the one
        moving the fewest bytes (operands resharded there, the result to ``inst``'s own
        sharding). Returns (*operand tilings, result tiling) or None."""
        t = self.target(inst)
        now = [self.vals[id(o)].tiling for o in inst.operands]
        options = []
        for cand in cands:
            if any(c is None for c in cand):
                continue
            res = result_of(*cand)
            if res is not None:
                options.append(((*cand, res), lambda cand=cand, res=res: sum(
                    self.plan_cost(v, c, o.shape) for v, c, o in zip(now, cand, inst.operands))
                    + self.plan_cost(res, t, inst.shape)))
        return self.cheapest(options)

    def cheapest(self, cands: Sequence[tuple[Any, Callable[[], int]]]) -> Any:
        """The candidate whose cost function (bytes moved) is lowest; the first of equals."""
        best, best_cost = None, None
        for cand, cost in cands:
            c = cost()
            if best_cost is None or c < best_cost:
                best, best_cost = cand, c
        return best

    # --- values -----------------------------------------------------------------------
    def target(self, inst: Instruction) -> Tiling:
        return Tiling.from_sharding(inst.sharding, len(inst.shape.dims), self.n)

    def tiling_of(self, old: Instruction) -> Tiling:
        """The current tiling of an array operand (a pending sum counts as resolved)."""
        t = self.vals[id(old)].tiling
        if not isinstance(t, Tiling):
            raise SpmdError(f"%{old.name}: a manual or tuple value where an array is needed")
        return t.without_partial() if t.partial is not None else t

    def get(self, old: Instruction, want: Tiling) -> Instruction:
        """``old``'s partitioned value split as ``want`` (one reshard per value and split,
        reused by every user that wants it so)."""
        v = self.vals[id(old)]
        if v.tiling == MANUAL:
            raise SpmdError(f"%{old.name} is a value of a manual computation (shard_map) used "
                            "outside it; only SPMDShardToFullShape may read it")
        key = (id(v.inst), want.tiles, want.index)
        hit = self.reshards.get(key)
        if hit is None:
            hit = self.reshards[key] = self.reshard(v.inst, v.tiling, want, old.shape)
        return hit

    def get_tuple(self, old: Instruction) -> Instruction:
        """A tuple-shaped operand with every array leaf whole (for fallback ops)."""
        v = self.vals[id(old)]
        if not isinstance(v.tiling, tuple):
            return v.inst
        parts = []
        for ev in v.tiling:
            if isinstance(ev.tiling, Tiling):
                rep = Tiling.replicated(len(ev.global_shape.dims), self.n)
                parts.append(self.reshard(ev.inst, ev.tiling, rep, ev.global_shape))
            elif isinstance(ev.tiling, tuple):
                parts.append(self.get_tuple_value(ev))
            else:
                parts.append(ev.inst)
        if all(p is e.inst for p, e in zip(parts, v.tiling)) and v.inst.opcode == "tuple":
            return v.inst
        return self.add("tuple", parts, TupleShape(tuple(p.shape for p in parts)))

    def get_tuple_value(self, v: Value) -> Instruction:
        parts = []
        for ev in v.tiling:
            rep = Tiling.replicated(len(ev.global_shape.dims), self.n) \
                if isinstance(ev.tiling, Tiling) else None
            parts.append(self.reshard(ev.inst, ev.tiling, rep, ev.global_shape)
                         if rep is not None else ev.inst)
        return self.add("tuple", parts, TupleShape(tuple(p.shape for p in parts)))

    def whole(self, old: Instruction) -> Instruction:
        if old.shape.is_tuple:
            return self.get_tuple(old)
        if old.shape.is_token:
            return self.vals[id(old)].inst
        v = self.vals[id(old)]
        if v.tiling == MANUAL:
            return v.inst
        return self.get(old, Tiling.replicated(len(old.shape.dims), self.n))

    def tuple_value(self, new: Instruction, tilings: Sequence[Tiling], g: Any) -> Value:
        """A tuple-shaped new instruction as a Value whose elements are its leaves."""
        els = tuple(Value(self.add("get-tuple-element", [new], s, {"index": k}), t, gs)
                    for k, (s, t, gs) in enumerate(zip(new.shape.elements, tilings,
                                                       g.elements)))
        return Value(new, els, g)

    # --- the pass ---------------------------------------------------------------------
    def run(self) -> None:
        self.manual = manual_region(self.old)
        for inst in self.old.post_order():
            self.vals[id(inst)] = self.partition(inst)
        root = self.old.root
        self.comp.root = self.finish_root(root)
        self.module.add_computation(self.comp)
        self.module.entry = self.comp
        self.module.computations.remove(self.old)
        self.module.remove_unreachable_computations()
        self.module.config["num_partitions"] = self.n
        layout = self.module.config.get("entry_computation_layout")
        if layout is not None:
            from hlo.text.parser import ComputationLayout
            self.module.config["entry_computation_layout"] = ComputationLayout(
                tuple(p.shape for p in self.comp.parameters), self.comp.root.shape)

    def finish_root(self, root: Instruction) -> Instruction:
        v = self.vals[id(root)]
        s = root.sharding
        if root.shape.is_tuple:
            elems = s.elements if isinstance(s, Sharding) and s.is_tuple else None
            parts = []
            for k, ev in enumerate(v.tiling if isinstance(v.tiling, tuple) else []):
                want = (Tiling.from_sharding(elems[k], len(ev.global_shape.dims), self.n)
                        if elems else Tiling.replicated(len(ev.global_shape.dims), self.n))
                parts.append(self.reshard(ev.inst, ev.tiling, want, ev.global_shape))
            if not parts:
                return self.get_tuple(root)
            out = self.add("tuple", parts, TupleShape(tuple(p.shape for p in parts)))
        else:
            out = self.get(root, self.target(root))
            if out is v.inst and out.opcode == "parameter":
                out = self.add("copy", [out], out.shape)
        if s is not None:
            out.attrs["sharding"] = s
        return out

    def partition(self, inst: Instruction) -> Value:
        opc = inst.opcode
        if id(inst) in self.manual:
            return HANDLERS["manual"](self, inst)
        if opc == "tuple":
            els = tuple(self.vals[id(o)] for o in inst.operands)
            t = self.add("tuple", [e.inst for e in els],
                         TupleShape(tuple(e.inst.shape for e in els)))
            return Value(t, els, inst.shape)
        if opc == "get-tuple-element":
            src = self.vals[id(inst.operands[0])]
            if isinstance(src.tiling, tuple):
                return src.tiling[inst.attrs["index"]]
            return self.fallback(inst)
        if opc == "parameter":
            t = self.target(inst)
            p = self.add("parameter", [], local_shape(inst.shape, self.local(t, inst.shape)),
                         dict(inst.attrs), name=inst.name, parameter_number=inst.parameter_number)
            return Value(p, t, inst.shape)
        if not inst.shape.is_tuple and inst.shape.is_token:
            return self.fallback(inst)
        rule = HANDLERS.get(opc)
        if rule is None and not inst.shape.is_tuple:
            if inst.op.elementwise:
                rule = HANDLERS["elementwise"]
            elif rules.passthrough_dims(inst) is not None:
                rule = HANDLERS["passthrough"]
        return rule(self, inst) if rule is not None else self.fallback(inst)

    def fallback(self, inst: Instruction) -> Value:
        """Run the op on whole operands; the result is replicated."""
        ops = [self.whole(o) for o in inst.operands]
        attrs = {k: v for k, v in inst.attrs.items() if k != "sharding"}
        new = self.add(inst.opcode, ops, inst.shape, attrs, literal=inst.literal,
                       name=inst.name)
        return self.replicated_value(new, inst.shape)

    def replicated_value(self, new: Instruction, g: Any) -> Value:
        if g.is_tuple:
            els = tuple(self.replicated_value(self.add("get-tuple-element", [new], s,
                                                       {"index": k}), s)
                        for k, s in enumerate(g.elements))
            return Value(new, els, g)
        if g.is_token:
            return Value(new, None, g)
        return Value(new, Tiling.replicated(len(g.dims), self.n), g)

    def local_op(self, inst: Instruction, ops: list[Instruction], t: Tiling,
                 attrs: Optional[dict] = None) -> Value:
        """``inst`` on local operands, its result split as ``t``."""
        a = {k: v for k, v in inst.attrs.items() if k != "sharding"}
        a.update(attrs or {})
        new = self.add(inst.opcode, ops, local_shape(inst.shape, self.local(t, inst.shape)), a,
                       name=inst.name)
        return Value(new, t, inst.shape)


def _compatible(src: Tiling, dst: Tiling, i: int, size: int) -> bool:
    """dst's tile of dim i lies inside src's on every device (so a slice gets there). An
    unevenly split dim nests only from whole to split, or into the same split: its tile
    boundaries move when the tile count changes."""
    if dst.tiles[i] % src.tiles[i]:
        return False
    if size % dst.tiles[i] and src.tiles[i] not in (1, dst.tiles[i]):
        return False
    r = dst.tiles[i] // src.tiles[i]
    return all(d[i] // r == s[i] for s, d in zip(src.index, dst.index))


def _max_channel_id(module: Module) -> int:
    """The largest channel_id in the module (a manual computation brings its own)."""
    return max((int(i.attrs["channel_id"]) for i in module.all_instructions()
                if i.attrs.get("channel_id") is not None), default=0)


def mixed_index(ix: Sequence[int], dims: Sequence[int], tiles: Sequence[int]) -> int:
    """Row-major number of the tile (ix restricted to ``dims``)."""
    v = 0
    for d in dims:
        v = v * tiles[d] + ix[d]
    return v


def partial_is_wellformed(res: Tiling, pieces: int) -> bool:
    """Devices holding one output tile hold distinct pieces of its sum, every piece
    equally often (so grouping them sums each piece once)."""
    seen: dict[tuple, list[int]] = {}
    for d, ix in enumerate(res.index):
        seen.setdefault(ix, []).append(res.partial[d] if res.partial else 0)
    if len(seen) != math.prod(res.tiles) or len({len(v) for v in seen.values()}) != 1:
        return False
    if res.partial is not None:
        return all(sorted(set(v)) == list(range(pieces)) and len(v) % pieces == 0
                   for v in seen.values())
    return True


@register_pass
@dataclass(frozen=True)
class SpmdPartitioner:
    """Rewrite the sharded entry computation into the per-device program."""
    name = "spmd-partitioner"
    num_partitions: int = 0     # 0: from the module (config or its shardings)

    def run(self, module: Module) -> bool:
        if module.entry is None:
            return False
        n = self.num_partitions or num_devices(module)
        if n <= 1 and not any(i.sharding is not None for i in module.entry.instructions):
            return False
        if any(i.opcode in COLLECTIVES for i in module.entry.instructions) and \
                module.config.get("spmd_partitioned"):
            return False
        Partitioner(module, n).run()
        return True


def collective_stats(module: Module) -> dict[str, tuple[int, int]]:
    """opcode -> (count, bytes) of the collectives in ``module`` (every computation).

    Bytes per device: the larger of operand and result array bytes of each collective
    (what one device sends or receives at most), the same measure for hlotk and XLA. An
    asynchronous pair counts once, at its start (``async-start`` by the op it wraps)."""
    out: dict[str, list[int]] = {}
    wrappers = {id(i.attrs["calls"]) for i in module.all_instructions()
                if i.opcode == "async-start"}
    for c in module.computations:
        if id(c) in wrappers:            # counted at its async-start
            continue
        for i in c.instructions:
            base, res_shape = i.opcode, i.shape
            if i.opcode.endswith("-start"):
                base = i.opcode[:-6]
                if i.shape.is_tuple and base != "all-reduce":
                    res_shape = i.shape.elements[1]     # ((operands), result, ...)
            if base == "async" and i.opcode == "async-start":
                wrapped = i.attrs["calls"].root
                base, res_shape = wrapped.opcode, wrapped.shape
            if base not in COLLECTIVES:
                continue
            res = [s for s in (res_shape.elements if res_shape.is_tuple else (res_shape,))
                   if not s.is_tuple]
            rb = sum(s.byte_size for s in res)
            ob = sum(o.shape.byte_size for o in i.operands if not o.shape.is_tuple)
            e = out.setdefault(base, [0, 0])
            e[0] += 1
            e[1] += max(rb, ob)
    return {k: (v[0], v[1]) for k, v in out.items()}

"""The SPMD partitioner: one sharded module -> the program every device runs.

Each instruction of the entry computation (shardings filled in by
``sharding-propagation``) becomes instructions on local shapes: the piece of each array
one device holds. Values carry a ``Tiling`` (which device holds which tile, and whether
the tile is still a partial sum). Where what a value is and what its user needs differ,
``reshard`` inserts the communication, cheapest first:

- a partial sum -> ``reduce-scatter`` when that lands on the wanted split, else
  ``all-reduce`` (XLA's partial results after a dot whose contracting dim is split);
- same tile grid, other devices -> ``collective-permute``;
- a dim split the user does not want -> ``all-to-all`` onto the dim it wants split, or
  ``all-gather`` of that dim;
- a dim the user wants split further -> ``dynamic-slice`` at offsets looked up by
  ``partition-id`` (no communication).

A dot tries four placements (operands as they are; operands matching the result; the
rhs matching the lhs; the lhs matching the rhs) and keeps the one moving fewest bytes.
Ops without a partitioning rule run on whole (replicated) operands, which is always
correct. Collectives carry ``channel_id`` and ``use_global_device_ids`` with replica
groups of partition ids, printed in iota form when they are one (XLA's spelling).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from hlo import dtypes as dt
from hlo.ir import Computation, Instruction, Module
from hlo.sharding import Sharding
from hlo.shape import Layout, Shape, TupleShape

from ..base import register_pass
from . import rules
from .propagation import num_devices
from .tiling import SpmdError, Tiling, layered_groups, replica_groups

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def _shape(like: Shape, dims: Sequence[int]) -> Shape:
    layout = Layout(tuple(range(len(dims) - 1, -1, -1))) if like.layout is not None else None
    return Shape(like.dtype, tuple(dims), layout)


def _bytes(shape: Shape, dims: Sequence[int]) -> int:
    return math.prod(dims) * shape.dtype.itemsize


@dataclass
class _Value:
    inst: Instruction
    tiling: Any                  # Tiling, or a tuple of _Value for tuple values
    global_shape: Any


class _Partitioner:
    def __init__(self, module: Module, n: int):
        self.module = module
        self.n = n
        old = module.entry
        assert old is not None
        self.old = old
        self.comp = Computation(module.unique_computation_name(old.name + "_spmd"))
        self.vals: dict[int, _Value] = {}
        self.channels = itertools.count(1)
        self._pid: Optional[Instruction] = None
        self._adders: dict[str, Computation] = {}
        self.emit = True
        self.cost = 0

    # --- emitting ---------------------------------------------------------------------
    def add(self, opcode: str, operands: Sequence[Instruction], shape: Any,
            attrs: Optional[dict] = None, literal: Any = None, name: Optional[str] = None,
            parameter_number: Optional[int] = None) -> Instruction:
        inst = Instruction(opcode, list(operands), shape, attrs or {}, literal=literal,
                           parameter_number=parameter_number)
        return self.comp.add_instruction(inst, name=name)

    def partition_id(self) -> Instruction:
        if self._pid is None:
            self._pid = self.add("partition-id", [], Shape(dt.U32, ()))
        return self._pid

    def per_device_scalar(self, values: Sequence[int]) -> Instruction:
        """s32[] holding ``values[partition-id]`` (XLA's table lookup)."""
        if len(set(values)) == 1:
            return self.add("constant", [], Shape(dt.S32, ()),
                            literal=np.asarray(values[0], np.int32))
        table = self.add("constant", [], Shape(dt.S32, (self.n,), Layout((0,))),
                         literal=np.asarray(values, np.int32))
        one = self.add("dynamic-slice", [table, self.partition_id()],
                       Shape(dt.S32, (1,), Layout((0,))), {"dynamic_slice_sizes": (1,)})
        return self.add("reshape", [one], Shape(dt.S32, ()))

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

    # --- resharding -------------------------------------------------------------------
    def local(self, t: Tiling, g: Shape, what: str = "value") -> tuple[int, ...]:
        return t.local_dims(g.dims, what)

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
            if not _compatible(src, dst, i):
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
            if loc[j] % p:
                continue
            tiles = list(src.tiles)
            tiles[j] *= p
            index = [tuple(ix[k] * p + rank_of[d] if k == j else ix[k] for k in range(src.rank))
                     for d, ix in enumerate(src.index)]
            new = Tiling(tuple(tiles), tuple(index))
            if all(_compatible(new, dst, i) for i in range(src.rank)):
                dims = list(loc)
                dims[j] //= p
                y = self.collective("reduce-scatter", x, _shape(g, dims), groups, loc,
                                    dimensions=(j,), to_apply=src.reducer)
                return y, new
        y = self.collective("all-reduce", x, _shape(g, loc), groups, loc, to_apply=src.reducer)
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
        return self.collective("collective-permute", x, _shape(g, loc), [], loc, pairs=tuple(sorted(pairs)))

    def _all_to_all(self, x, src: Tiling, dst: Tiling, g: Shape):
        """Move a split from dim i (which dst keeps whole) to dim j (which src keeps whole)
        with one all-to-all when dst's split of j is src's split of i, device by device."""
        for i, j in itertools.permutations(range(src.rank), 2):
            if not (src.tiles[i] > 1 and dst.tiles[i] == 1 and src.tiles[j] == 1
                    and dst.tiles[j] == src.tiles[i]):
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
            if not all(_compatible(new, dst, k) for k in range(src.rank)):
                continue
            loc = list(self.local(src, g))
            if loc[j] % src.tiles[i]:
                continue
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
        r = self.add("reshape", [x], _shape(g, split))
        a2a = self.add("all-to-all", [r], _shape(g, split),
                       {"channel_id": next(self.channels), "replica_groups": replica_groups(groups),
                        "dimensions": (j,)})
        # dims of a2a: the original dims with j -> (j: sender, j+1: rest of j). The
        # sender is the tile of dim i, so it goes just before (major to) dim i.
        pos_i = i if i < j else i + 1
        order = [k for k in range(len(split)) if k != j]
        order.insert(order.index(pos_i), j)
        tdims = [split[k] for k in order]
        t = self.add("transpose", [a2a], _shape(g, tdims), {"dimensions": tuple(order)})
        return self.add("reshape", [t], _shape(g, out_loc))

    def _all_gather(self, x, src: Tiling, i: int, g: Shape):
        keys = [ix[:i] + ix[i + 1:] for ix in src.index]
        groups = layered_groups(keys, [ix[i] for ix in src.index])
        new = src.replicate_dims([i])
        y = self.collective("all-gather", x, _shape(g, self.local(new, g)), groups,
                            self.local(src, g), dimensions=(i,))
        return y, new

    def _slice(self, x, src: Tiling, dst: Tiling, g: Shape):
        dloc = self.local(dst, g, "resharded value")
        if not self.emit:
            return None
        sloc = self.local(src, g)
        starts = []
        for i in range(dst.rank):
            offs = [d[i] * dloc[i] - s[i] * sloc[i] for s, d in zip(src.index, dst.index)]
            starts.append(self.per_device_scalar(offs))
        return self.add("dynamic-slice", [x] + starts, _shape(g, dloc),
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

    # --- values -----------------------------------------------------------------------
    def target(self, inst: Instruction) -> Tiling:
        return Tiling.from_sharding(inst.sharding, len(inst.shape.dims), self.n)

    def get(self, old: Instruction, want: Tiling) -> Instruction:
        v = self.vals[id(old)]
        return self.reshard(v.inst, v.tiling, want, old.shape)

    def get_tuple(self, old: Instruction) -> Instruction:
        """A tuple-shaped operand with every array leaf whole (for fallback ops)."""
        v = self.vals[id(old)]
        if not isinstance(v.tiling, tuple):
            return v.inst
        parts = []
        for i, ev in enumerate(v.tiling):
            if isinstance(ev.tiling, tuple):
                parts.append(ev.inst)
            else:
                rep = Tiling.replicated(len(ev.global_shape.dims), self.n)
                parts.append(self.reshard(ev.inst, ev.tiling, rep, ev.global_shape))
        if all(p is e.inst for p, e in zip(parts, v.tiling)) and v.inst.opcode == "tuple":
            return v.inst
        return self.add("tuple", parts, TupleShape(tuple(p.shape for p in parts)))

    def whole(self, old: Instruction) -> Instruction:
        if old.shape.is_tuple:
            return self.get_tuple(old)
        if getattr(old.shape, "is_token", False) or old.shape.dtype.name == "token":
            return self.vals[id(old)].inst
        return self.get(old, Tiling.replicated(len(old.shape.dims), self.n))

    # --- the pass ---------------------------------------------------------------------
    def run(self) -> None:
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

    def partition(self, inst: Instruction) -> _Value:
        opc = inst.opcode
        if inst.shape.is_tuple:
            if opc == "tuple":
                els = tuple(self.vals[id(o)] for o in inst.operands)
                t = self.add("tuple", [e.inst for e in els],
                             TupleShape(tuple(e.inst.shape for e in els)))
                return _Value(t, els, inst.shape)
            return self.fallback(inst)
        if opc == "get-tuple-element":
            src = self.vals[id(inst.operands[0])]
            if isinstance(src.tiling, tuple):
                return src.tiling[inst.attrs["index"]]
            return self.fallback(inst)
        if opc == "parameter":
            t = self.target(inst)
            p = self.add("parameter", [], _shape(inst.shape, self.local(t, inst.shape,
                                                                        f"parameter %{inst.name}")),
                         {k: v for k, v in inst.attrs.items()}, name=inst.name,
                         parameter_number=inst.parameter_number)
            return _Value(p, t, inst.shape)
        if getattr(inst.shape, "dtype", None) is not None and inst.shape.dtype.name == "token":
            return self.fallback(inst)
        t = self.target(inst)
        handler = getattr(self, "_" + opc.replace("-", "_"), None)
        if opc == "custom-call":
            if inst.attrs.get("custom_call_target") == "Sharding":
                x = self.get(inst.operands[0], t)
                return _Value(x, t, inst.shape)
            handler = None
        if inst.op.elementwise:
            handler = self._elementwise
        elif rules.passthrough_dims(inst) is not None:
            handler = self._passthrough
        if handler is None:
            return self.fallback(inst)
        return handler(inst, t)

    def fallback(self, inst: Instruction) -> _Value:
        """Run the op on whole operands; the result is replicated."""
        ops = [self.whole(o) for o in inst.operands]
        attrs = {k: v for k, v in inst.attrs.items() if k != "sharding"}
        new = self.add(inst.opcode, ops, inst.shape, attrs, literal=inst.literal)
        if inst.shape.is_tuple:
            els = tuple(_Value(self.add("get-tuple-element", [new], s, {"index": k}),
                               Tiling.replicated(len(s.dims), self.n), s)
                        if not s.is_tuple else _Value(new, (), s)
                        for k, s in enumerate(inst.shape.elements))
            return _Value(new, els, inst.shape)
        if getattr(inst.shape, "dtype", None) is not None and inst.shape.dtype.name == "token":
            return _Value(new, None, inst.shape)
        return _Value(new, Tiling.replicated(len(inst.shape.dims), self.n), inst.shape)

    def _local_op(self, inst: Instruction, ops: list[Instruction], t: Tiling,
                  attrs: Optional[dict] = None) -> _Value:
        a = {k: v for k, v in inst.attrs.items() if k != "sharding"}
        a.update(attrs or {})
        new = self.add(inst.opcode, ops, _shape(inst.shape, self.local(t, inst.shape)), a)
        return _Value(new, t, inst.shape)

    # --- per-op rules -----------------------------------------------------------------
    def _elementwise(self, inst: Instruction, t: Tiling) -> _Value:
        ops = [self.get(o, t) if len(o.shape.dims) == t.rank else self.whole(o)
               for o in inst.operands]
        return self._local_op(inst, ops, t)

    def _broadcast(self, inst: Instruction, t: Tiling) -> _Value:
        want = rules.backward(inst, 0, t)
        return self._local_op(inst, [self.get(inst.operands[0], want)], t)

    def _transpose(self, inst: Instruction, t: Tiling) -> _Value:
        want = rules.backward(inst, 0, t)
        return self._local_op(inst, [self.get(inst.operands[0], want)], t)

    def _copy(self, inst: Instruction, t: Tiling) -> _Value:
        return self._local_op(inst, [self.get(inst.operands[0], t)], t)

    def _reshape(self, inst: Instruction, t: Tiling) -> _Value:
        src, dst = inst.operands[0].shape.dims, inst.shape.dims
        want_in = rules.reshape_tiling(t, dst, src)
        out = rules.reshape_tiling(want_in, src, dst)
        return self._local_op(inst, [self.get(inst.operands[0], want_in)], out)

    def _passthrough(self, inst: Instruction, t: Tiling) -> _Value:
        pt = rules.passthrough_dims(inst)
        want = rules.map_dims(t, {d: d for d in pt}, t.rank)
        n_data = len(inst.operands) if inst.opcode == "concatenate" else 1
        ops = [self.get(o, want) if k < n_data else self.whole(o)
               for k, o in enumerate(inst.operands)]
        loc = self.local(want, inst.shape)
        attrs: dict[str, Any] = {}
        if inst.opcode == "slice":
            from hlo.attrs import SliceDim, SliceSpec
            attrs["slice"] = SliceSpec(tuple(
                SliceDim(0, loc[i], 1) if i in pt else sd
                for i, sd in enumerate(inst.attrs["slice"].dims)))
        if inst.opcode == "dynamic-slice":
            attrs["dynamic_slice_sizes"] = tuple(loc)
        return self._local_op(inst, ops, want, attrs)

    def _reduce(self, inst: Instruction, t: Tiling) -> _Value:
        if len(inst.operands) != 2:
            return self.fallback(inst)
        x, init = inst.operands
        red = list(inst.attrs["dimensions"])
        kept = [d for d in range(len(x.shape.dims)) if d not in red]
        cur = self.vals[id(x)].tiling
        cur = cur.without_partial() if cur.partial is not None else cur
        options = [rules.map_dims(t, {i: d for i, d in enumerate(kept)}, len(x.shape.dims))]
        # Keep the operand's split of the reduced dims: reduce locally, then combine.
        keep = Tiling.from_index(
            [cur.tiles[d] if d in red else t.tiles[kept.index(d)] for d in range(cur.rank)],
            [tuple(ci[d] if d in red else ti[kept.index(d)] for d in range(cur.rank))
             for ci, ti in zip(cur.index, t.index)])
        if keep is not None and any(keep.tiles[d] > 1 for d in red):
            options.append(keep)
        best = min(options, key=lambda o: self.plan_cost(self.vals[id(x)].tiling, o, x.shape)
                   + self._reduce_result_cost(o, red, t, inst))
        xin = self.get(x, best)
        val = self._local_op(inst, [xin, self.whole(init)], _reduce_result(best, red, t, inst))
        return val

    def _reduce_result_cost(self, o: Tiling, red, t: Tiling, inst: Instruction) -> int:
        return self.plan_cost(_reduce_result(o, red, t, inst), t, inst.shape)

    def _dot(self, inst: Instruction, t: Tiling) -> _Value:
        lhs, rhs = inst.operands
        lv, rv = self.vals[id(lhs)], self.vals[id(rhs)]
        lt = lv.tiling.without_partial() if lv.tiling.partial is not None else lv.tiling
        rt = rv.tiling.without_partial() if rv.tiling.partial is not None else rv.tiling
        cands = [(lt, rt),
                 (rules.dot_operand_from_result(inst, t, 0),
                  rules.dot_operand_from_result(inst, t, 1)),
                 (lt, _dot_match(inst, lt, 1)),
                 (_dot_match(inst, rt, 0), rt)]
        best, best_cost = None, None
        for cl, cr in cands:
            if cl is None or cr is None:
                continue
            res = _dot_local_result(inst, cl, cr, self.adder(inst.shape.dtype)
                                    if self.emit else None)
            if res is None:
                continue
            cost = (self.plan_cost(lv.tiling, cl, lhs.shape) + self.plan_cost(rv.tiling, cr, rhs.shape)
                    + self.plan_cost(res, t, inst.shape))
            if best_cost is None or cost < best_cost:
                best, best_cost = (cl, cr, res), cost
        if best is None:
            return self.fallback(inst)
        cl, cr, res = best
        return self._local_op(inst, [self.get(lhs, cl), self.get(rhs, cr)], res)


def _compatible(src: Tiling, dst: Tiling, i: int) -> bool:
    """dst's tile of dim i lies inside src's on every device (so a slice gets there)."""
    if dst.tiles[i] % src.tiles[i]:
        return False
    r = dst.tiles[i] // src.tiles[i]
    return all(d[i] // r == s[i] for s, d in zip(src.index, dst.index))


def _reduce_result(o: Tiling, red: list[int], t: Tiling, inst: Instruction) -> Tiling:
    kept = [d for d in range(o.rank) if d not in red]
    tiles = tuple(o.tiles[d] for d in kept)
    index = tuple(tuple(ix[d] for d in kept) for ix in o.index)
    if any(o.tiles[d] > 1 for d in red):
        partial = tuple(_mixed(ix, red, o.tiles) for ix in o.index)
        return Tiling(tiles, index, partial, inst.attrs["to_apply"])
    return Tiling(tiles, index)


def _mixed(ix: Sequence[int], dims: Sequence[int], tiles: Sequence[int]) -> int:
    v = 0
    for d in dims:
        v = v * tiles[d] + ix[d]
    return v


def _dot_match(inst: Instruction, t: Tiling, which: int) -> Optional[Tiling]:
    """The other operand's tiling splitting batch and contracting dims like ``t`` does
    (operand ``1 - which``), its free dims whole."""
    lb, rb, lc, rc, lf, rf = rules.dot_dims(inst)
    if which == 1:   # build rhs from lhs t
        m = dict(zip(lb, rb))
        m.update(zip(lc, rc))
        rank = len(inst.operands[1].shape.dims)
    else:
        m = dict(zip(rb, lb))
        m.update(zip(rc, lc))
        rank = len(inst.operands[0].shape.dims)
    return rules.map_dims(t.without_partial(), m, rank)


def _dot_local_result(inst: Instruction, lt: Tiling, rt: Tiling, adder: Any
                      ) -> Optional[Tiling]:
    """The tiling a local dot of these operand tiles produces, or None if the devices'
    batch/contracting tiles disagree."""
    lb, rb, lc, rc, lf, rf = rules.dot_dims(inst)
    for a, b in list(zip(lb, rb)) + list(zip(lc, rc)):
        if lt.tiles[a] != rt.tiles[b]:
            return None
        if any(li[a] != ri[b] for li, ri in zip(lt.index, rt.index)):
            return None
    tiles = [lt.tiles[d] for d in lb + lf] + [rt.tiles[d] for d in rf]
    index = tuple(tuple(li[d] for d in lb + lf) + tuple(ri[d] for d in rf)
                  for li, ri in zip(lt.index, rt.index))
    partial = None
    if any(lt.tiles[d] > 1 for d in lc):
        partial = tuple(_mixed(li, lc, lt.tiles) for li in lt.index)
    res = Tiling(tuple(tiles), index, partial, adder)
    # Devices holding one output tile must hold distinct pieces, equally many each.
    seen: dict[tuple, list[int]] = {}
    for d, ix in enumerate(index):
        seen.setdefault(ix, []).append(partial[d] if partial else 0)
    if len(seen) != math.prod(tiles) or len({len(v) for v in seen.values()}) != 1:
        return None
    if partial is not None:
        per = [sorted(v) for v in seen.values()]
        pieces = math.prod(lt.tiles[d] for d in lc)
        if any(sorted(set(v)) != list(range(pieces)) or len(v) % pieces for v in per):
            return None
    return res


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
        _Partitioner(module, n).run()
        return True


def collective_stats(module: Module) -> dict[str, tuple[int, int]]:
    """opcode -> (count, bytes) of the collectives in ``module`` (every computation).

    Bytes per device: the larger of operand and result array bytes of each collective
    (what one device sends or receives at most), the same measure for hlotk and XLA."""
    out: dict[str, list[int]] = {}
    for c in module.computations:
        for i in c.instructions:
            base = i.opcode[:-6] if i.opcode.endswith("-start") else i.opcode
            if base not in COLLECTIVES:
                continue
            res = [s for s in (i.shape.elements if i.shape.is_tuple else (i.shape,))
                   if not s.is_tuple]
            rb = sum(s.byte_size for s in res)
            ob = sum(o.shape.byte_size for o in i.operands if not o.shape.is_tuple)
            e = out.setdefault(base, [0, 0])
            e[0] += 1
            e[1] += max(rb, ob)
    return {k: (v[0], v[1]) for k, v in out.items()}

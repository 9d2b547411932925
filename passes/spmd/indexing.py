"""Partitioning rules of gather and scatter (XLA's GatherScatter partitioning cases).

**Gather** is local along three kinds of dimensions, in any combination:

- operand passthrough: an operand dim every slice takes whole keeps its split in the
  result's offset dim (slice size = the local piece);
- index parallel: the indices' batch dims keep their split in the result's batch dims,
  also the ``operand_batching_dims`` split like their ``start_indices_batching_dims``;
- trivially sliced: an operand dim indexed with slice size 1 (an embedding table split by
  rows). Each device holds rows [lo, lo + piece): the global index is clamped as the gather
  would clamp it, moved by -lo, rows outside [0, real rows of the piece) give zeros, and
  the result is a partial sum over the devices of that split (an all-reduce or a
  reduce-scatter, whichever the user needs, as after a contracting dot).

**Scatter** (one operand) is local along passthrough window dims, batching dims and
trivially sliced dims (indices moved by -lo; an update whose index leaves the piece is out
of bounds there and skipped, exactly XLA's rule). With an ``add`` combiner and indices
split on other dims (index parallel), every device scatters its updates into zeros, the
partial sums are combined, and the operand is added.

The placement moving the fewest bytes among the candidates (operands as they are, each
side alone, from the result's wanted split) wins; none valid: whole operands.
"""
from __future__ import annotations

from typing import Any, Optional

from hlo import dtypes as dt
from hlo.evaluator.reductions import simple_binary_reducer
from hlo.ir import Instruction

from . import rules
from .partitioner import Partitioner, Value, handler, local_shape, mixed_index, \
    partial_is_wellformed
from .tiling import Tiling


def _keep(t: Tiling, dims: set[int]) -> Tiling:
    return t.replicate_dims([d for d in range(t.rank) if d not in dims])


def _combine(out_rank: int, parts: list[tuple[Tiling, dict[int, int]]]) -> Optional[Tiling]:
    """The result tiling taking dim ``src`` of each part's tiling to result dim
    ``map[src]``; None when two parts split one result dim or the grid is uneven."""
    tiles = [1] * out_rank
    for t, m in parts:
        for s, o in m.items():
            if t.tiles[s] > 1:
                if tiles[o] > 1:
                    return None
                tiles[o] = t.tiles[s]
    n = parts[0][0].num_devices
    index = []
    for d in range(n):
        ix = [0] * out_rank
        for t, m in parts:
            for s, o in m.items():
                if t.tiles[s] > 1:
                    ix[o] = t.index[d][s]
        index.append(tuple(ix))
    return Tiling.from_index(tiles, index)


# --- gather ----------------------------------------------------------------------------
class _GatherDims:
    def __init__(self, inst: Instruction):
        a = inst.attrs
        self.op_rank = len(inst.operands[0].shape.dims)
        self.idx_rank = len(inst.operands[1].shape.dims)
        self.out_rank = len(inst.shape.dims)
        self.whole, self.batch = rules.gather_dim_maps(inst)
        self.ivd = a["index_vector_dim"]
        self.start_map = list(a["start_index_map"])
        self.sliced = {d for d in self.start_map if a["slice_sizes"][d] == 1}
        self.op_batching = list(a.get("operand_batching_dims", ()))
        self.idx_batching = list(a.get("start_indices_batching_dims", ()))

    def operand_dims(self) -> set[int]:
        return set(self.whole) | self.sliced | set(self.op_batching)

    def result(self, ot: Tiling, it: Tiling, adder: Any) -> Optional[Tiling]:
        if any(ot.tiles[d] > 1 for d in range(self.op_rank) if d not in self.operand_dims()):
            return None
        if self.ivd < self.idx_rank and it.tiles[self.ivd] > 1:
            return None
        for od, idd in zip(self.op_batching, self.idx_batching):
            if ot.tiles[od] != it.tiles[idd] or any(a[od] != b[idd] for a, b in
                                                    zip(ot.index, it.index)):
                return None
        res = _combine(self.out_rank, [(ot, self.whole), (it, self.batch)])
        if res is None:
            return None
        split = sorted(d for d in self.sliced if ot.tiles[d] > 1)
        if not split:
            return res
        partial = tuple(mixed_index(ix, split, ot.tiles) for ix in ot.index)
        pieces = 1
        for d in split:
            pieces *= ot.tiles[d]
        res = Tiling(res.tiles, res.index, partial, adder)
        return res if partial_is_wellformed(res, pieces) else None


@handler("gather")
def gather(p: Partitioner, inst: Instruction) -> Value:
    operand, indices = inst.operands
    dims = _GatherDims(inst)
    t = p.target(inst)
    ot, it = p.tiling_of(operand), p.tiling_of(indices)
    rep_o = Tiling.replicated(dims.op_rank, p.n)
    rep_i = Tiling.replicated(dims.idx_rank, p.n)
    from_t_o = rules.map_dims(t.without_partial(), {o: s for s, o in dims.whole.items()},
                              dims.op_rank)
    from_t_i = rules.map_dims(t.without_partial(), {o: s for s, o in dims.batch.items()},
                              dims.idx_rank)
    keep_i = {d for d in range(dims.idx_rank) if d != dims.ivd}
    adder = p.adder(inst.shape.dtype) if p.emit else None
    best = p.place(inst, [(_keep(ot, dims.operand_dims()), _keep(it, keep_i)),
                          (_keep(ot, dims.operand_dims()), rep_i),
                          (rep_o, _keep(it, keep_i)),
                          (from_t_o, from_t_i)],
                   lambda co, ci: dims.result(co, ci, adder))
    if best is None:
        return p.fallback(inst)
    co, ci, res = best
    x, idx = p.get(operand, co), p.get(indices, ci)
    oloc = p.local(co, operand.shape)
    sizes = tuple(oloc[d] if d in dims.whole else s
                  for d, s in enumerate(inst.attrs["slice_sizes"]))
    split = [d for d in dims.sliced if co.tiles[d] > 1]
    mask = None
    if split:
        idx, mask = _localize_indices(p, inst, idx, ci, co, split, clamp=True)
    out = p.add("gather", [x, idx], local_shape(inst.shape, p.local(res, inst.shape)),
                {**_attrs(inst), "slice_sizes": sizes}, name=inst.name)
    if mask is not None:
        batch_out = [dims.batch[d] for d in sorted(dims.batch)]
        mb = p.add("broadcast", [mask], local_shape(out.shape, out.shape.dims, dt.PRED),
                   {"dimensions": tuple(batch_out)})
        zeros = p.broadcast(p.scalar(0, inst.shape.dtype), out.shape.dims)
        out = p.add("select", [mb, out, zeros], out.shape)
    return Value(out, res, inst.shape)


def _localize_indices(p: Partitioner, inst: Instruction, idx: Instruction, it: Tiling,
                      ot: Tiling, split: list[int], clamp: bool
                      ) -> tuple[Instruction, Optional[Instruction]]:
    """Indices into the local piece of the operand dims ``split`` (trivially sliced and
    split): each component moved by -lo of this device's piece; with ``clamp`` the global
    index is first clamped as a gather clamps it. Returns (indices, in-range mask over the
    batch dims) — the mask only with ``clamp`` (a scatter's out-of-range updates are
    skipped by the scatter itself)."""
    a = inst.attrs
    operand, indices = inst.operands[0], inst.operands[1]
    g_op = operand.shape
    start_map = list(a["start_index_map"] if inst.opcode == "gather"
                     else a["scatter_dims_to_operand_dims"])
    ivd = a["index_vector_dim"]
    idt = indices.shape.dtype
    ishape = idx.shape
    rank = len(ishape.dims)
    explicit = ivd < rank
    comp_dims = list(ishape.dims)
    if explicit:
        comp_dims[ivd] = 1
    oloc = p.local(ot, g_op)
    comps, masks = [], []
    for k, d in enumerate(start_map):
        if explicit:
            from hlo.attrs import SliceDim, SliceSpec
            c = p.add("slice", [idx], local_shape(ishape, comp_dims), {"slice": SliceSpec(tuple(
                SliceDim(k, k + 1) if i == ivd else SliceDim(0, n)
                for i, n in enumerate(ishape.dims)))})
        else:
            c = idx
        if d in split:
            if clamp:
                lo_b = p.broadcast(p.scalar(0, idt), comp_dims)
                hi_b = p.broadcast(p.scalar(g_op.dims[d] - 1, idt), comp_dims)
                c = p.add("clamp", [lo_b, c, hi_b], c.shape)
            lo = p.per_device_scalar([ix[d] * oloc[d] for ix in ot.index], idt)
            c = p.add("subtract", [c, p.broadcast(lo, comp_dims)], c.shape)
            if clamp:
                valid = p.per_device_scalar(ot.valid_counts(g_op.dims, d), idt)
                ge = p.add("compare", [c, p.broadcast(p.scalar(0, idt), comp_dims)],
                           local_shape(c.shape, comp_dims, dt.PRED), {"direction": "GE"})
                lt = p.add("compare", [c, p.broadcast(valid, comp_dims)],
                           local_shape(c.shape, comp_dims, dt.PRED), {"direction": "LT"})
                masks.append(p.add("and", [ge, lt], ge.shape))
        comps.append(c)
    new_idx = comps[0] if len(comps) == 1 else \
        p.add("concatenate", comps, ishape, {"dimensions": (ivd,)})
    mask = None
    for m in masks:
        mask = m if mask is None else p.add("and", [mask, m], m.shape)
    if mask is not None and explicit:
        batch = [n for i, n in enumerate(ishape.dims) if i != ivd]
        mask = p.add("reshape", [mask], local_shape(mask.shape, batch))
    return new_idx, mask


# --- scatter ---------------------------------------------------------------------------
class _ScatterDims:
    def __init__(self, inst: Instruction):
        a = inst.attrs
        operand, indices, updates = inst.operands
        self.op_rank = len(operand.shape.dims)
        self.idx_rank = len(indices.shape.dims)
        self.upd_rank = len(updates.shape.dims)
        self.ivd = a["index_vector_dim"]
        uwd = list(a["update_window_dims"])
        iwd = set(a.get("inserted_window_dims", ()))
        self.op_batching = list(a.get("input_batching_dims", ()))
        self.idx_batching = list(a.get("scatter_indices_batching_dims", ()))
        sdod = list(a["scatter_dims_to_operand_dims"])
        window_op = [d for d in range(self.op_rank) if d not in iwd and d not in self.op_batching]
        self.window = dict(zip(window_op, uwd))                       # operand dim -> update dim
        upd_scatter = [d for d in range(self.upd_rank) if d not in uwd]
        idx_batch = [d for d in range(self.idx_rank) if d != self.ivd]
        self.scatter = dict(zip(idx_batch, upd_scatter))              # indices dim -> update dim
        self.passthrough = {d for d, u in self.window.items()
                            if d not in sdod and updates.shape.dims[u] == operand.shape.dims[d]}
        window_size = {d: updates.shape.dims[u] for d, u in self.window.items()}
        self.sliced = {d for d in sdod if window_size.get(d, 1) == 1}

    def operand_dims(self) -> set[int]:
        return self.passthrough | self.sliced | set(self.op_batching)

    def updates(self, ot: Tiling, it: Tiling) -> Optional[Tiling]:
        return _combine(self.upd_rank, [(ot, {d: u for d, u in self.window.items()
                                               if d in self.passthrough}),
                                        (it, self.scatter)])

    def batching_agrees(self, ot: Tiling, it: Tiling) -> bool:
        return all(ot.tiles[od] == it.tiles[idd] and all(a[od] == b[idd] for a, b in
                                                         zip(ot.index, it.index))
                   for od, idd in zip(self.op_batching, self.idx_batching))


@handler("scatter")
def scatter(p: Partitioner, inst: Instruction) -> Value:
    if len(inst.operands) != 3 or inst.shape.is_tuple:
        return p.fallback(inst)
    operand, indices, updates = inst.operands
    dims = _ScatterDims(inst)
    t = p.target(inst)
    ot, it = p.tiling_of(operand), p.tiling_of(indices)
    vals = [p.vals[id(o)].tiling for o in inst.operands]
    keep_i = set(dims.idx_batching)
    options = []
    # Local: the operand split on passthrough/sliced/batching dims, the indices only on the
    # batching dims (every device sees every update that may land in its piece).
    for co in (_keep(ot, dims.operand_dims()), _keep(t, dims.operand_dims())):
        ci = _keep(it, keep_i) if keep_i else Tiling.replicated(dims.idx_rank, p.n)
        if not dims.batching_agrees(co, ci):
            ci = _batching_like(co, dims, p.n)
            if ci is None:
                continue
        cu = dims.updates(co, ci)
        if cu is not None:
            options.append((("local", co, ci, cu), lambda co=co, ci=ci, cu=cu:
                            _moves(p, inst, vals, (co, ci, cu)) + p.plan_cost(co, t, inst.shape)))
    # Index parallel (add only): updates split with their indices, partial sums combined.
    if simple_binary_reducer(inst.attrs["to_apply"]) == "add" and not dims.op_batching:
        co = _keep(ot, dims.passthrough)
        ci = _keep(it, set(dims.scatter))
        cu = dims.updates(co, ci)
        if cu is not None and any(ci.tiles[d] > 1 for d in dims.scatter):
            split = [d for d in dims.scatter if ci.tiles[d] > 1]
            partial = tuple(mixed_index(ix, split, ci.tiles) for ix in ci.index)
            pieces = 1
            for d in split:
                pieces *= ci.tiles[d]
            res = Tiling(co.tiles, co.index, partial, inst.attrs["to_apply"])
            if partial_is_wellformed(res, pieces):
                options.append((("parallel", co, ci, cu), lambda co=co, ci=ci, cu=cu, res=res:
                                _moves(p, inst, vals, (co, ci, cu)) + p.plan_cost(res, co, inst.shape)
                                + p.plan_cost(co, t, inst.shape)))
    best = p.cheapest(options)
    if best is None:
        return p.fallback(inst)
    how, co, ci, cu = best
    x, idx, upd = (p.get(o, c) for o, c in zip(inst.operands, (co, ci, cu)))
    split = [d for d in dims.sliced if co.tiles[d] > 1]
    if split:
        idx, _ = _localize_indices(p, inst, idx, ci, co, split, clamp=False)
    if how == "local":
        return p.local_op(inst, [x, idx, upd], co)
    # Index parallel: padded update rows hold garbage; zero them (adding 0 is harmless).
    upd = p.mask_padding(upd, cu, updates.shape, list(dims.scatter.values()),
                         p.scalar(0, updates.shape.dtype))
    zeros = p.broadcast(p.scalar(0, operand.shape.dtype), x.shape.dims)
    summed = p.add("scatter", [zeros, idx, upd], x.shape, _attrs(inst), name=inst.name)
    split_i = [d for d in dims.scatter if ci.tiles[d] > 1]
    partial = Tiling(co.tiles, co.index, tuple(mixed_index(ix, split_i, ci.tiles)
                                              for ix in ci.index), inst.attrs["to_apply"])
    total = p.reshard(summed, partial, co, inst.shape)
    return Value(p.add("add", [x, total], x.shape), co, inst.shape)


def _batching_like(ot: Tiling, dims: _ScatterDims, n: int) -> Optional[Tiling]:
    """The indices tiling splitting the batching dims as the operand's are split."""
    m = dict(zip(dims.op_batching, dims.idx_batching))
    return rules.map_dims(ot, m, dims.idx_rank) if m else Tiling.replicated(dims.idx_rank, n)


def _moves(p: Partitioner, inst: Instruction, vals: list, wants: tuple) -> int:
    return sum(p.plan_cost(v, w, o.shape) for v, w, o in zip(vals, wants, inst.operands))


def _attrs(inst: Instruction) -> dict:
    return {k: v for k, v in inst.attrs.items() if k != "sharding"}

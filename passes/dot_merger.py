"""``dot-merger``: dots that read one operand become one dot over the others concatenated.

A transformer's q, k and v projections read the same activations with three weights::

    q = dot(h, wq)   k = dot(h, wk)   v = dot(h, wv)          # h [B, S, D], w* [D, N*]

become one GEMM that reads ``h`` once, then slices of its result::

    w = concatenate(wq, wk, wv), dimensions={1}               # [D, Nq + Nk + Nv]
    qkv = dot(h, w)                                           # [B, S, Nq + Nk + Nv]
    q = slice(qkv, [0:B, 0:S, 0:Nq])   k = slice(qkv, [.., Nq:Nq+Nk])   v = ...

(XLA's DotMerger does the same.) The slices cost nothing where their readers take them in
place: a loop fusion reads its operand's slice, and a flash-attention fusion reads q, k and
v through strides (passes/fusion/attention_pass.py takes the slices into its fusion).

Which dots merge: dots of one computation with the same operand on the same side, the same
dimension numbers and element types, no data dependence between them (every other operand
comes before the first of the dots in the instruction order), other operands equal in shape
except along their first free dimension (the one concatenated). Not the dots the
flash-attention kernels run (their operands are the kernels', not a GEMM's).

When it pays: the concatenate is a copy of the other operands (read and write) before the
GEMM, so it must be small against what merging saves (one read of the shared operand and
one launch per dot merged, a fuller GEMM). The rule: the concatenated operand's bytes are
at most ``max_concat_fraction`` (1/4) of the merged GEMM's minimal bytes (shared operand +
concatenated operand + output). Weights pass it: the suite's transformer concatenates
3 x 2 MiB of weights for a GEMM of 16 + 6 + 48 MiB (0.09); XLA on the H200 runs its merged
8192x1024x3072 GEMM in 65.3 us + 3.9 us of concatenate against hlotk's three GEMMs' 79.7 us.
Activations do not: jax.grad's weight gradients of the same projections (dot(h, dq),
dot(h, dk), dot(h, dv) over the batch) would concatenate 3 x 16 MiB for a GEMM of
16 + 48 + 6 MiB (0.69): a 96 MiB copy (~25 us at the H200's bandwidth) to save two 16 MiB
reads (~8 us). And every reader of a slice must read it in place (``_sliced_in_place``):
a slice returned, or read by a library GEMM or an attention backward, would be copied.

Not in the default pipelines (passes/pipelines.py ``with_dot_merger`` adds it): on the H200
hlotk's merged GEMM (torch.mm's cuBLAS heuristic, no algorithm search) took 72.6 us, its
concatenate kernel 6.1 us, and a memset + launch gaps ~5 us came with the GEMM, so the
transformer's kernel span went 406 -> 412 us (benchmarks/NOTES.md, i14-qkv).
"""
from __future__ import annotations

from dataclasses import dataclass

from hlo.attrs import SliceDim, SliceSpec
from hlo.ir import Computation, Instruction, Module
from hlo.shape import Layout, Shape

from .base import register_pass
from .rewrite import emit


def _free_dims(dot: Instruction, side: int) -> list[int]:
    a = dot.attrs
    s = "lhs" if side == 0 else "rhs"
    used = set(a.get(f"{s}_batch_dims", ())) | set(a.get(f"{s}_contracting_dims", ()))
    return [d for d in range(dot.operands[side].shape.rank) if d not in used]


def _attrs_key(dot: Instruction) -> str:
    """The dot's attributes but its metadata: equal keys, equal dimension numbers and
    precision."""
    return repr(sorted((k, repr(v)) for k, v in dot.attrs.items() if k != "metadata"))


def _row_major(shape: Shape) -> bool:
    return shape.layout is None or shape.layout.is_row_major


def _with_dim(shape: Shape, dim: int, size: int) -> Shape:
    dims = list(shape.dims)
    dims[dim] = size
    layout = None if shape.layout is None else Layout.row_major(len(dims))
    return Shape(shape.dtype, tuple(dims), layout)


@register_pass
@dataclass(frozen=True)
class DotMerger:
    """Dots sharing an operand run as one dot over their other operands concatenated,
    where the concatenated operand is at most ``max_concat_fraction`` of the merged dot's
    minimal bytes (module docstring)."""
    name = "dot-merger"
    max_concat_fraction: float = 0.25

    def run(self, module: Module) -> bool:
        changed = False
        for comp in list(module.computations):
            if comp.fusion_instruction is not None:
                continue
            changed |= self._run_computation(comp)
        return changed

    def _run_computation(self, comp: Computation) -> bool:
        from .fusion.attention import NoMatch, match_attention
        from .fusion.attention_pass import kernel_dots
        dots = [i for i in comp.instructions if i.opcode == "dot" and i.shape.is_array]
        if len(dots) < 2:
            return False
        kernels = {id(d) for d in kernel_dots(dots)}
        # the dots of forward-only attentions: their fusion takes q, k, v slices in
        forward: set[int] = set()
        for d in dots:
            try:
                m = match_attention(d)
            except NoMatch:
                continue
            if m is not None:
                forward.update((id(m.qk), id(m.pv)))
        changed = False
        for side, group in self._groups(comp, [d for d in dots if id(d) not in kernels]):
            changed |= self._merge(comp, side, group, forward)
        return changed

    @staticmethod
    def _sliced_in_place(dot: Instruction, forward: set[int]) -> bool:
        """Whether every reader of ``dot`` (through row-major reshapes) would read a slice
        of the merged result in place: a fusible op other than a dot (a loop fusion reads
        its operand's slice), or q/k/v of a forward flash attention. A library GEMM, an
        attention backward, an output of the program or a non-fusible op would get a copy
        kernel writing the slice first, which costs about what merging saves."""
        from .fusion.legality import fusible
        todo, seen = [dot], set()
        while todo:
            inst = todo.pop()
            if inst.is_root:
                return False
            if id(inst) in seen:
                continue
            seen.add(id(inst))
            for u in inst.users:
                if u.opcode in ("bitcast", "reshape"):
                    todo.append(u)
                elif u.opcode == "dot":
                    if id(u) not in forward:
                        return False
                elif not fusible(u):
                    return False
        return True

    def _groups(self, comp: Computation, dots: list[Instruction]
                ) -> list[tuple[int, list[Instruction]]]:
        """(shared side, dots) for every set of at least two dots that may merge; a dot in
        two sets (it shares its lhs with some and its rhs with others) goes to the first."""
        keyed: dict[tuple, list[Instruction]] = {}
        for d in dots:
            for side in (0, 1):
                shared, other = d.operands[side], d.operands[1 - side]
                if shared is other or not _row_major(d.shape):
                    continue
                free = _free_dims(d, 1 - side)
                if not free or not isinstance(other.shape, Shape):
                    continue
                rest = tuple(n if k != free[0] else -1 for k, n in enumerate(other.shape.dims))
                key = (id(shared), side, _attrs_key(d), d.shape.dtype.name,
                       other.shape.dtype.name, rest)
                keyed.setdefault(key, []).append(d)
        taken: set[int] = set()
        out = []
        for key, group in keyed.items():
            group = [d for d in group if id(d) not in taken]
            # one dot per other operand (a repeated one is CSE's business)
            seen: set[int] = set()
            group = [d for d in group if not (id(d.operands[1 - key[1]]) in seen
                                              or seen.add(id(d.operands[1 - key[1]])))]
            if len(group) >= 2:
                taken.update(id(d) for d in group)
                out.append((key[1], group))
        return out

    def _pays(self, side: int, group: list[Instruction]) -> bool:
        shared = group[0].operands[side].shape.byte_size
        concat = sum(d.operands[1 - side].shape.byte_size for d in group)
        out = sum(d.shape.byte_size for d in group)
        return concat <= self.max_concat_fraction * (shared + concat + out)

    def _merge(self, comp: Computation, side: int, group: list[Instruction],
               forward: set[int]) -> bool:
        order = {id(i): k for k, i in enumerate(comp.instructions)}
        group = sorted(group, key=lambda d: order[id(d)])
        first = group[0]
        # no data dependence: every other operand exists before the first dot (the order is
        # topological, so none of them reads any of the dots)
        if any(order[id(d.operands[1 - side])] > order[id(first)] for d in group):
            return False
        if not self._pays(side, group) or not all(self._sliced_in_place(d, forward) for d in group):
            return False
        others = [d.operands[1 - side] for d in group]
        cat_dim = _free_dims(first, 1 - side)[0]
        sizes = [o.shape.dims[cat_dim] for o in others]
        cat_shape = _with_dim(others[0].shape, cat_dim, sum(sizes))
        cat = emit(first, "concatenate", others, cat_shape, name="concatenate",
                   dimensions=(cat_dim,))
        # where the concatenated free dim lands in the dot's output
        nb = len(first.attrs.get("lhs_batch_dims", ()))
        j = _free_dims(first, 1 - side).index(cat_dim)
        out_dim = nb + (len(_free_dims(first, 0)) + j if side == 0 else j)
        merged_shape = _with_dim(first.shape, out_dim, sum(sizes))
        ops = [first.operands[side], cat] if side == 0 else [cat, first.operands[side]]
        attrs = {k: v for k, v in first.attrs.items() if k != "metadata"}
        merged = emit(first, "dot", ops, merged_shape, name="dot_merged", **attrs)
        start, slices = 0, []
        for d, n in zip(group, sizes):
            starts = [0] * d.shape.rank
            limits = list(d.shape.dims)
            starts[out_dim], limits[out_dim] = start, start + n
            spec = SliceSpec(tuple(SliceDim(a, b, 1) for a, b in zip(starts, limits)))
            s = emit(first, "slice", [merged], d.shape, name="slice", slice=spec)
            if "metadata" in d.attrs:
                s.attrs["metadata"] = d.attrs["metadata"]
            slices.append(s)
            start += n
        for d, s in zip(group, slices):
            d.replace_all_uses_with(s)
            comp.remove_instruction(d)
        return True

"""Layout assignment: give every array in the module a physical layout (minor_to_major).

What XLA's LayoutAssignment does, in a form that can be read in one sitting:

1. **Constraints.** Entry parameters and the entry result keep the layouts of
   ``module.config["entry_computation_layout"]`` (row-major where it says nothing). Target
   rules (``TargetRules``) fix what library calls need: on GPU a dot operand must have its
   batch dims major-most and its contracting and non-contracting dims as the two minor
   groups, in either order (cuBLAS transposes through its flags); convolutions get cuDNN's
   layouts. On the CPU dots are row-major, as Eigen wants them.
2. **Backward wishes.** Walking from the root up, each instruction passes a wished layout
   to its operands through ops that would otherwise move data: elementwise ops (same
   layout), transposes (the permuted layout, which makes the transpose free), reshapes
   (a layout that makes it a bitcast), slices/pads/concatenates, row reductions.
3. **Forward choice.** In topological order each result takes its fixed layout, else what
   its operands give it where that costs nothing (elementwise: the operands' common layout;
   transpose: the permuted operand layout, i.e. a bitcast; reduce: the operand's order),
   else the wish, else the default. Called computations are assigned in the caller's
   context: while body/condition share the loop state's layout, conditional branches take
   their operands' layouts and return the conditional's, call/fusion parameters match the
   operands, reducers and comparators are scalars. A computation needed with two different
   signatures is cloned.
4. **Conflicts.** Where an operand's layout is not what its user needs, a ``copy`` with the
   needed layout (a physical transpose) is inserted.
5. **Bitcasts.** Transposes and reshapes that no longer move data become ``bitcast``.

Statistics of the last run are in ``LayoutAssignment.last_stats`` (a class-level dict):
``transposes_removed`` (transposes that became bitcasts), ``copies_inserted``,
``reshapes_to_bitcast`` and ``computations_cloned``.

``LayoutNormalization`` (``layout-normalization``) goes back: every internal layout becomes
the default, bitcasts become explicit transposes/reshapes and layout-changing copies plain
copies, so later passes can ignore layouts. The entry signature keeps its layouts.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Optional, Sequence

from hlo import layout_util as lu
from hlo.attrs import COMPUTATION_ATTRS, Raw
from hlo.ir import Computation, Instruction, Module
from hlo.shape import AnyShape, Layout, Shape, TupleShape
from hlo.text.parser import ComputationLayout

from .base import ModuleSnapshot, PassError, register_pass

GPU_TARGETS = ("gpu", "cuda", "h100", "h200", "a100")
CPU_TARGETS = ("cpu",)

# Ops whose array operands of the result's rank should share the result's layout: reading
# and writing in the same order is what makes them cheap (and in place for DUS).
_SAME_LAYOUT = {"dynamic-update-slice"}
# Ops that keep the rank and move data in a way any layout supports: their natural result
# layout is their first operand's, and a wish on the result passes on to that operand.
_LAYOUT_PRESERVING = {"slice", "dynamic-slice", "pad", "reverse", "concatenate",
                      "reduce-window", "dynamic-update-slice", "copy"}
# Asynchronous collectives' dones: the start's result (element 1, or all of it).
_ASYNC_DONE_ELEMENT = {"all-reduce-done": False, "all-gather-done": True,
                       "collective-permute-done": True, "async-done": True}


# --- target rules ---------------------------------------------------------------------------
def _order_to_layout(major_to_minor: Sequence[int]) -> Layout:
    return Layout(tuple(reversed(tuple(major_to_minor))))


@dataclass(frozen=True)
class _Requirement:
    """What a user needs of one operand: ``accepts(layout)`` and the layout to copy to."""
    preferred: Layout
    options: tuple[tuple[int, ...], ...] = ()   # accepted minor_to_major tuples; () = preferred only

    def accepts(self, layout: Layout) -> bool:
        m2m = layout.minor_to_major
        return m2m == self.preferred.minor_to_major or m2m in self.options


def _gemm_requirement(shape: Shape, batch: Sequence[int], contracting: Sequence[int],
                      non_contracting_last: bool) -> _Requirement:
    """cuBLAS operand: batch dims major-most (in order), then the contracting and the
    non-contracting dims as two adjacent groups in either order."""
    rank = shape.rank
    batch, contracting = list(batch), list(contracting)
    free = [d for d in range(rank) if d not in batch and d not in contracting]
    a = batch + free + contracting      # row-major when contracting is last
    b = batch + contracting + free
    options = (_order_to_layout(a).minor_to_major, _order_to_layout(b).minor_to_major)
    default = lu.default_layout(rank)
    if default.minor_to_major in options:
        preferred = default
    else:
        preferred = _order_to_layout(b if non_contracting_last else a)
    return _Requirement(preferred, options)


def eight_bit_dot(inst: Instruction) -> bool:
    """A dot of two 8-bit operands (s8/u8/f8): its GPU operands must be K-major."""
    return inst.opcode == "dot" and all(
        not o.shape.is_tuple and o.shape.dtype.bits == 8 for o in inst.operands)


# The only opcodes ``operand_requirement`` can return a requirement for.
_LIBRARY_OPS = frozenset(("dot", "convolution", "custom-call"))


class TargetRules:
    """Layouts that library calls of a target require. The CPU: row-major dots."""

    def __init__(self, target: str, kernel_dots: frozenset[int] = frozenset()):
        self.target = target
        self.is_gpu = target in GPU_TARGETS
        # ids of dots that a flash-attention kernel will run, not cuBLAS: the kernel reads
        # q, k and v through any strides, so they keep their layouts (no copies)
        self.kernel_dots = kernel_dots

    def operand_requirement(self, inst: Instruction, k: int) -> Optional[_Requirement]:
        if inst.opcode not in _LIBRARY_OPS:
            return None     # asked for every operand of every instruction, twice
        op = inst.operands[k]
        if op.shape.is_tuple or not op.shape.is_array or op.shape.rank == 0:
            return None
        if inst.opcode == "dot":
            if not self.is_gpu:
                return _Requirement(lu.default_layout(op.shape.rank))
            if id(inst) in self.kernel_dots:
                return None
            side = "lhs" if k == 0 else "rhs"
            req = _gemm_requirement(op.shape, inst.attrs.get(f"{side}_batch_dims", ()),
                                    inst.attrs.get(f"{side}_contracting_dims", ()),
                                    non_contracting_last=(k == 1))
            if eight_bit_dot(inst):
                # 8-bit tensor-core GEMMs (Hopper's wgmma, cuBLASLt's IMMA) read both
                # operands K-major: the contracting dims minor-most, a copy where not.
                k_major = Layout(req.options[0])
                return _Requirement(k_major, (k_major.minor_to_major,))
            return req
        if inst.opcode == "convolution" and self.is_gpu:
            lhs, rhs, _ = self._conv_orders(inst)
            return _Requirement(_order_to_layout(lhs if k == 0 else rhs))
        if inst.opcode == "custom-call":
            # A library routine reads its operands as row-major arrays.
            return _Requirement(lu.default_layout(op.shape.rank))
        return None

    def result_layout(self, inst: Instruction) -> Optional[Layout]:
        """A layout the target fixes for the result, or None when it is free."""
        if inst.shape.is_tuple or inst.shape.rank == 0:
            return None
        if inst.opcode == "dot" and not self.is_gpu:
            return lu.default_layout(inst.shape.rank)
        if inst.opcode == "convolution" and self.is_gpu:
            return _order_to_layout(self._conv_orders(inst)[2])
        if inst.opcode == "custom-call":
            return lu.default_layout(inst.shape.rank)
        return None

    def result_accepts(self, inst: Instruction, layout: Layout) -> bool:
        """GPU dots write batch-major, then the two free groups in either order."""
        if inst.opcode != "dot" or not self.is_gpu or id(inst) in self.kernel_dots:
            return True
        rank = inst.shape.rank
        nb = len(inst.attrs.get("lhs_batch_dims", ()))
        lhs = inst.operands[0].shape
        n_lhs_free = lhs.rank - nb - len(inst.attrs.get("lhs_contracting_dims", ()))
        lhs_free = list(range(nb, nb + n_lhs_free))
        rhs_free = list(range(nb + n_lhs_free, rank))
        order = list(lu.major_to_minor(layout, rank))
        return order in (list(range(nb)) + lhs_free + rhs_free,
                         list(range(nb)) + rhs_free + lhs_free)

    def _conv_orders(self, inst: Instruction) -> tuple[list[int], list[int], list[int]]:
        """cuDNN's layouts as XLA:GPU picks them: NHWC (``b01f``/OHWI) for 16-bit and 8-bit
        inputs, which the tensor cores want, NCHW (``bf01``/OIHW) otherwise."""
        dl = inst.attrs["dim_labels"]
        nhwc = inst.operands[0].shape.dtype.name in ("f16", "bf16", "s8", "u8")
        if _weight_gradient(inst):
            # jax.grad's weight gradient labels the activations' batch as the conv's
            # feature and their channels as its batch (f01b, i01o). cuDNN's backward-filter
            # (codegen/library/cudnn.py) reads the activations and the output gradient as
            # themselves: in their own NHWC (NCHW), which the forward and the batch norm
            # around it use too. In the conv's labels instead, they were laid out with the
            # image batch minor, and every fusion writing or reducing them strided.
            lhs = [dl.input_feature, *dl.input_spatial, dl.input_batch] if nhwc else \
                [dl.input_feature, dl.input_batch, *dl.input_spatial]
            rhs = [dl.kernel_input_feature, *dl.kernel_spatial, dl.kernel_output_feature] \
                if nhwc else [dl.kernel_input_feature, dl.kernel_output_feature,
                              *dl.kernel_spatial]
            out = [dl.output_batch, *dl.output_spatial, dl.output_feature] if nhwc else \
                [dl.output_batch, dl.output_feature, *dl.output_spatial]
            return lhs, rhs, out
        if nhwc:
            return ([dl.input_batch, *dl.input_spatial, dl.input_feature],
                    [dl.kernel_output_feature, *dl.kernel_spatial, dl.kernel_input_feature],
                    [dl.output_batch, *dl.output_spatial, dl.output_feature])
        return ([dl.input_batch, dl.input_feature, *dl.input_spatial],
                [dl.kernel_output_feature, dl.kernel_input_feature, *dl.kernel_spatial],
                [dl.output_batch, dl.output_feature, *dl.output_spatial])


# --- helpers ----------------------------------------------------------------------------------
def _weight_gradient(inst: Instruction) -> bool:
    """Whether the CUDA backend runs this convolution as cuDNN's backward-filter."""
    from codegen.library.cudnn import plan
    p = plan(inst)
    return p is not None and p.kind == "filter_grad"


def _attention_dots(module: Module) -> frozenset[int]:
    """ids of the dots the fusion pass will turn into flash-attention kernels (forward
    and backward)."""
    from .fusion.attention_pass import kernel_dots
    return frozenset(id(d) for comp in module.computations
                     for d in kernel_dots(list(comp.instructions)))


def _is_elementwise(inst: Instruction) -> bool:
    if inst.opcode == "copy" or not inst.op.elementwise or inst.shape.is_tuple:
        return False
    return True


def _same_rank_operands(inst: Instruction) -> list[int]:
    """Indices of array operands with the result's rank (> 0)."""
    shape = inst.shape
    if shape.is_tuple or not shape.dims:
        return []
    rank = len(shape.dims)
    return [k for k, o in enumerate(inst.operands)
            if not o.shape.is_tuple and len(o.shape.dims) == rank and o.shape.is_array]


def _entry_signature(module: Module) -> tuple[list[AnyShape], AnyShape]:
    entry = module.entry
    assert entry is not None and entry.root is not None
    value = module.config.get("entry_computation_layout")
    if value is None:
        params, result = [p.shape for p in entry.parameters], entry.root.shape
    elif isinstance(value, ComputationLayout):
        params, result = list(value.parameters), value.result
    else:
        from hlo.verifier import parse_program_shape
        params, result = parse_program_shape(value.text if isinstance(value, Raw) else str(value))
    if len(params) != len(entry.parameters):
        raise PassError(f"entry_computation_layout has {len(params)} parameters, the entry "
                        f"%{entry.name} takes {len(entry.parameters)}")
    return [_fill(s) for s in params], _fill(result)


def _fill(shape: AnyShape) -> AnyShape:
    """Default layouts where a shape has none."""
    if shape.is_tuple:
        return TupleShape(tuple(_fill(e) for e in shape.elements))
    if shape.is_array and shape.layout is None:
        return shape.with_layout(lu.default_layout(shape.rank))
    return shape


def _same_layouts(a: AnyShape, b: AnyShape) -> bool:
    la = [s.layout for s in a.leaves() if s.is_array]
    lb = [s.layout for s in b.leaves() if s.is_array]
    return [x.minor_to_major if x else None for x in la] == \
        [x.minor_to_major if x else None for x in lb]


def _inverse_permuted(layout: Layout, permutation: Sequence[int]) -> Layout:
    """The operand layout that makes ``transpose(permutation)`` produce ``layout`` for free."""
    return Layout(tuple(permutation[d] for d in layout.minor_to_major))


def _reduce_operand_wish(inst: Instruction, k: int, result_layout: Optional[Layout]) -> Optional[Layout]:
    """Row reductions: keep the reduced dims minor-most, the kept dims in the result's order."""
    op = inst.operands[k].shape
    dims = sorted(int(d) for d in inst.attrs.get("dimensions", ()))
    if op.is_tuple or op.rank == 0 or not dims or dims != list(range(op.rank - len(dims), op.rank)):
        return None
    kept = [d for d in range(op.rank) if d not in dims]
    rank = len(kept)
    res_order = lu.major_to_minor(result_layout, rank) if result_layout is not None else range(rank)
    return _order_to_layout([kept[r] for r in res_order] + dims)


def _reduce_result_natural(inst: Instruction, k: int) -> Layout:
    """A reduce result keeps the operand's order of the dims it keeps."""
    op = inst.operands[k].shape
    dims = {int(d) for d in inst.attrs.get("dimensions", ())}
    renumber = {}
    for d in range(op.rank):
        if d not in dims:
            renumber[d] = len(renumber)
    return Layout(tuple(renumber[d] for d in lu.layout_of(op).minor_to_major if d in renumber))


# --- the pass ------------------------------------------------------------------------------------
@register_pass
@dataclass(frozen=True)
class LayoutAssignment:
    """Assign a layout to every array; see the module docstring."""
    name = "layout-assignment"
    target: str = "cpu"
    # Also turn reshapes that keep the physical order into bitcasts (XLA does this in its
    # layout-sensitive simplifier right after layout assignment).
    reshape_to_bitcast: bool = True

    last_stats: ClassVar[dict[str, int]] = {}

    def run(self, module: Module) -> bool:
        if self.target not in GPU_TARGETS + CPU_TARGETS:
            raise PassError(f"layout-assignment: unknown target {self.target!r}; known: "
                            f"{', '.join(GPU_TARGETS + CPU_TARGETS)}")
        before = ModuleSnapshot(module)
        assigner = _Assigner(module, TargetRules(self.target, _attention_dots(module)))
        params, result = _entry_signature(module)
        assert module.entry is not None
        assigner.assign(module.entry, params, result)
        module.config["entry_computation_layout"] = ComputationLayout(
            tuple(p.shape for p in module.entry.parameters), module.entry.root.shape)
        for comp in module.computations:
            assigner.make_bitcasts(comp, self.reshape_to_bitcast)
        type(self).last_stats = dict(assigner.stats)
        return before.changed(module)


class _Assigner:
    def __init__(self, module: Module, rules: TargetRules):
        self.module = module
        self.rules = rules
        self.done: dict[int, tuple[tuple[AnyShape, ...], AnyShape]] = {}
        self.copies: dict[tuple[int, tuple[int, ...]], Instruction] = {}
        self.stats: Counter = Counter(transposes_removed=0, copies_inserted=0,
                                      reshapes_to_bitcast=0, computations_cloned=0)

    # -- called computations --------------------------------------------------------------
    def callee(self, comp: Computation, params: Sequence[AnyShape],
               root: Optional[AnyShape]) -> Computation:
        """``comp`` assigned for this signature (a clone if it was assigned differently)."""
        params = tuple(params)
        seen = self.done.get(id(comp))
        if seen is not None:
            same_params = len(seen[0]) == len(params) and all(
                _same_layouts(a, b) for a, b in zip(seen[0], params))
            if same_params and (root is None or _same_layouts(seen[1], root)):
                return comp
            comp = self._clone(comp)
        self.assign(comp, list(params), root)
        return comp

    def _clone(self, comp: Computation) -> Computation:
        self.stats["computations_cloned"] += 1
        return self.module.clone_computation(comp)

    def _assign_called(self, inst: Instruction) -> None:
        """Assign the computations ``inst`` calls, fixing their signatures from its operands."""
        op = inst.opcode
        if op == "while":
            state = inst.operands[0].shape
            body = self.callee(inst.attrs["body"], [state], state)
            cond = self.callee(inst.attrs["condition"], [state], None)
            inst.attrs["body"], inst.attrs["condition"] = body, cond
        elif op == "conditional":
            result = lu.with_default_layouts(inst.shape)
            if "branch_computations" in inst.attrs:
                inst.attrs["branch_computations"] = tuple(
                    self.callee(c, [inst.operands[k + 1].shape], result)
                    for k, c in enumerate(inst.attrs["branch_computations"]))
            else:
                for k, key in enumerate(("true_computation", "false_computation")):
                    inst.attrs[key] = self.callee(inst.attrs[key], [inst.operands[k + 1].shape],
                                                  result)
        elif op == "async-done":       # runs nothing: the start's wrapped computation
            inst.attrs["calls"] = inst.operands[0].attrs["calls"]
        elif op in ("call", "fusion", "async-start"):
            key = "to_apply" if op == "call" else "calls"
            callee = self.callee(inst.attrs[key], [o.shape for o in inst.operands], None)
            inst.attrs[key] = callee
            if op == "fusion":
                callee.fusion_instruction = inst
        else:
            # Reducers, comparators, scatter combiners, map bodies: scalars; default layouts.
            for key in COMPUTATION_ATTRS:
                v = inst.attrs.get(key)
                if isinstance(v, Computation):
                    inst.attrs[key] = self.callee(v, [_fill(p.shape) for p in v.parameters],
                                                  _fill(v.root.shape))
                elif isinstance(v, tuple) and v and all(isinstance(c, Computation) for c in v):
                    inst.attrs[key] = tuple(
                        self.callee(c, [_fill(p.shape) for p in c.parameters], _fill(c.root.shape))
                        for c in v)

    # -- one computation -----------------------------------------------------------------
    def assign(self, comp: Computation, params: list[AnyShape], root: Optional[AnyShape]) -> None:
        assert comp.root is not None
        order = comp.post_order()
        original = {id(i): i.shape for i in order}
        for p, shape in zip(comp.parameters, params):
            if not p.shape.compatible(shape):
                raise PassError(f"layout-assignment: parameter %{p.name} of %{comp.name} is "
                                f"{p.shape.to_text(False)} but is given {shape.to_text(False)}")
        wants = self._wishes(comp, order, root, original)
        for inst in order:
            if inst.opcode == "parameter":
                inst.shape = params[inst.parameter_number]
                continue
            if inst.called_computations:
                self._assign_called(inst)
            inst.shape = self._choose(inst, wants, original)
            self._fix_operands(inst, original)
        if root is not None:
            comp.root = self._coerce(comp.root, root)
        self.done[id(comp)] = (tuple(params), comp.root.shape)

    def _wishes(self, comp: Computation, order: list[Instruction], root: Optional[AnyShape],
                original: dict[int, AnyShape]) -> dict[int, Layout]:
        """Backward pass: the layout each array value's users would like it to have."""
        wants: dict[int, Layout] = {}
        strong: set[int] = set()

        def wish(inst: Instruction, layout: Optional[Layout], mandatory: bool = False) -> None:
            if layout is None or inst.shape.is_tuple or not inst.shape.is_array:
                return
            if mandatory and id(inst) not in strong:
                wants[id(inst)] = layout
                strong.add(id(inst))
            elif id(inst) not in wants:
                wants[id(inst)] = layout

        def seed(inst: Instruction, shape: AnyShape) -> None:
            if shape.is_tuple and inst.opcode == "tuple":
                for o, s in zip(inst.operands, shape.elements):
                    seed(o, s)
            elif not shape.is_tuple:
                wish(inst, shape.layout, mandatory=True)

        if root is not None:
            seed(comp.root, root)
        for inst in reversed(order):
            for k, o in enumerate(inst.operands):
                req = self.rules.operand_requirement(inst, k)
                if req is not None and not req.options:
                    wish(o, req.preferred, mandatory=True)
            if inst.opcode == "bitcast":
                src = original[id(inst.operands[0])]
                wish(inst.operands[0], lu.layout_of(src), mandatory=True)
            w = wants.get(id(inst)) or self.rules.result_layout(inst)
            if w is None and inst.opcode == "reshape" and inst.shape.rank:
                # A reshape nobody constrains is produced row-major: ask its operand for the
                # layout that makes it a bitcast, so that a producer free to write any layout
                # (a flash-attention dot, a cuBLAS dot writing its free dims swapped) does,
                # instead of the reshape becoming a copy.
                w = lu.default_layout(inst.shape.rank)
            if w is None:
                continue
            if _is_elementwise(inst) or inst.opcode in _LAYOUT_PRESERVING:
                for k in _same_rank_operands(inst):
                    wish(inst.operands[k], w)
            elif inst.opcode == "transpose":
                wish(inst.operands[0], _inverse_permuted(w, inst.attrs["dimensions"]))
            elif inst.opcode == "reshape":
                wish(inst.operands[0], lu.reshape_bitcast_layout(
                    inst.shape.with_layout(w), inst.operands[0].shape.dims))
            elif inst.opcode == "reduce":
                n = len(inst.operands) // 2
                for k in range(n):
                    wish(inst.operands[k], _reduce_operand_wish(inst, k, w))
        return wants

    def _choose(self, inst: Instruction, wants: dict[int, Layout],
                original: dict[int, AnyShape]) -> AnyShape:
        """Forward pass: the result shape with layouts."""
        op, shape = inst.opcode, inst.shape
        if op == "tuple":
            return TupleShape(tuple(o.shape for o in inst.operands))
        if op == "get-tuple-element":
            return inst.operands[0].shape.elements[int(inst.attrs["index"])]
        if op == "while":
            return inst.operands[0].shape
        if op == "conditional":
            return inst.attrs.get("branch_computations", (inst.attrs.get("true_computation"),))[0] \
                .root.shape
        if op in ("call", "fusion"):
            return inst.attrs["to_apply" if op == "call" else "calls"].root.shape
        if op in _ASYNC_DONE_ELEMENT:    # a done is its start's result buffer
            start = inst.operands[0].shape
            return start.elements[1] if _ASYNC_DONE_ELEMENT[op] else start
        if op in ("all-gather-start", "collective-permute-start", "async-start"):
            # (operands, result, context...): element 0 is the operands' own buffers.
            held = [o.shape for o in inst.operands]
            held_shape = TupleShape(tuple(held)) if (op == "async-start" or len(held) > 1) \
                else held[0]
            result = (inst.attrs["calls"].root.shape if op == "async-start"
                      else _fill(shape.elements[1]))
            return TupleShape((held_shape, result) + tuple(_fill(e) for e in shape.elements[2:]))
        if op in ("all-reduce", "all-reduce-start"):
            # The result is reduced where the operand lies: the same layout (one copy less,
            # and a combined all-reduce packs its operands' bytes as they are).
            outs = [_fill(o.shape) for o in inst.operands]
            return TupleShape(tuple(outs)) if shape.is_tuple else outs[0]
        if op == "bitcast":
            return _fill(original[id(inst)])
        if shape.is_tuple:
            if op == "sort":
                return TupleShape(tuple(_fill(o.shape) for o in inst.operands))
            if op == "reduce":
                n = len(inst.operands) // 2
                return TupleShape(tuple(e.with_layout(_reduce_result_natural(inst, 0))
                                        for e in shape.elements[:n]))
            return _fill(shape)
        if not shape.is_array:
            return shape
        if shape.rank == 0:
            return shape.with_layout(Layout(()))
        fixed = self.rules.result_layout(inst)
        if fixed is not None:
            return shape.with_layout(fixed)
        want = wants.get(id(inst))
        natural = self._natural(inst, want)
        if natural is not None:
            rejected_by = self._rejecting_user(inst, natural)
            if rejected_by is None:
                return shape.with_layout(natural)
            if want is None:
                # Produce what the library call needs right here instead of a copy later.
                return shape.with_layout(rejected_by.preferred)
        if want is not None and self.rules.result_accepts(inst, want):
            return shape.with_layout(want)
        return shape.with_layout(lu.default_layout(shape.rank))

    def _natural(self, inst: Instruction, want: Optional[Layout]) -> Optional[Layout]:
        """The layout an instruction gets for free from its operands, if there is one worth
        taking over the users' wish."""
        op = inst.opcode
        same = _same_rank_operands(inst)
        if _is_elementwise(inst) and same:
            layouts = [inst.operands[k].shape.layout for k in same]
            counts = Counter(l.minor_to_major for l in layouts if l is not None)
            if not counts:
                return None
            if len(counts) == 1:
                return layouts[0]
            if want is not None and want.minor_to_major in counts:
                return want
            return Layout(counts.most_common(1)[0][0])
        if want is not None:
            return None  # everything below moves data anyway: give the users what they want
        if op in _LAYOUT_PRESERVING and same:
            return inst.operands[same[0]].shape.layout
        if op == "transpose":
            return lu.permute_layout(inst.operands[0].shape.layout, inst.shape.rank,
                                     inst.attrs["dimensions"])
        if op == "reshape":
            return lu.reshape_bitcast_layout(inst.operands[0].shape, inst.shape.dims)
        if op == "reduce":
            return _reduce_result_natural(inst, 0)
        return None

    def _rejecting_user(self, inst: Instruction, layout: Layout) -> Optional[_Requirement]:
        """The requirement of the first user that does not accept ``layout``, if any."""
        for u in inst.users:
            if u.opcode not in _LIBRARY_OPS:
                # operand_requirement is None for all its operands: not walked (issue 13:
                # the entry's root tuple of an AdamW step over 200 arrays has 600 operands,
                # each of whose users walked all 600, a third of the pass)
                continue
            for k, o in enumerate(u.operands):
                if o is inst:
                    req = self.rules.operand_requirement(u, k)
                    if req is not None and not req.accepts(layout):
                        return req
        return None

    def _required(self, inst: Instruction, k: int, original: dict[int, AnyShape],
                  same: Sequence[int]) -> Optional[_Requirement]:
        """``same``: ``_same_rank_operands(inst)``."""
        o = inst.operands[k]
        if o.shape.is_tuple or not o.shape.is_array or o.shape.rank == 0:
            return None
        req = self.rules.operand_requirement(inst, k)
        if req is not None:
            return req
        if inst.opcode == "bitcast":
            return _Requirement(lu.layout_of(original[id(o)]))
        if (_is_elementwise(inst) or inst.opcode in _SAME_LAYOUT) and k in same:
            return _Requirement(inst.shape.layout)
        return None

    def _fix_operands(self, inst: Instruction, original: dict[int, AnyShape]) -> None:
        # Once, not per operand: a copy put in for one operand has that operand's shape
        # but for its layout, so the ranks this looks at stay as they are.
        same = _same_rank_operands(inst)
        for k in range(len(inst.operands)):
            req = self._required(inst, k, original, same)
            o = inst.operands[k]
            if req is not None and not req.accepts(o.shape.layout):
                inst.replace_operand(k, self._copy(o, req.preferred))

    def _copy(self, value: Instruction, layout: Layout) -> Instruction:
        """A copy of ``value`` in ``layout``, shared by every user that needs the same; placed
        right after ``value`` so that it comes before all of them."""
        key = (id(value), layout.minor_to_major)
        if key in self.copies:
            return self.copies[key]
        comp = value.parent
        assert comp is not None
        c = Instruction("copy", [value], value.shape.with_layout(layout), name=value.name + ".copy")
        after = comp.instructions.index(value) + 1
        if after < len(comp.instructions):
            comp.insert_before(c, comp.instructions[after])
        else:
            comp.add_instruction(c)
        self.stats["copies_inserted"] += 1
        self.copies[key] = c
        return c

    def _coerce(self, value: Instruction, shape: AnyShape) -> Instruction:
        """``value`` with exactly the layouts of ``shape`` (copies where they differ)."""
        if _same_layouts(value.shape, shape):
            return value
        comp = value.parent
        assert comp is not None
        if not shape.is_tuple:
            c = Instruction("copy", [value], shape, name=value.name + ".copy")
            comp.add_instruction(c)
            self.stats["copies_inserted"] += 1
            return c
        parts = []
        for i, s in enumerate(shape.elements):
            if value.opcode == "tuple":
                part = value.operands[i]
            else:
                part = comp.add_instruction(Instruction(
                    "get-tuple-element", [value], value.shape.elements[i], {"index": i}))
            parts.append(self._coerce(part, s))
        new = comp.add_instruction(Instruction("tuple", parts,
                                               TupleShape(tuple(p.shape for p in parts))))
        if value.opcode == "tuple" and not value.users and value is comp.root:
            comp.root = new
            comp.remove_instruction(value)
        return new

    # -- bitcasts -----------------------------------------------------------------------------
    def make_bitcasts(self, comp: Computation, reshapes: bool) -> None:
        """Transposes (and reshapes) that keep the physical order become bitcasts."""
        for inst in list(comp.instructions):
            if inst.opcode == "transpose":
                op = inst.operands[0].shape
                if not lu.transpose_is_bitcast(op, inst.shape, inst.attrs["dimensions"]):
                    continue
                key = "transposes_removed"
            elif inst.opcode == "reshape" and reshapes:
                if not lu.reshape_is_bitcast(inst.operands[0].shape, inst.shape):
                    continue
                key = "reshapes_to_bitcast"
            else:
                continue
            b = Instruction("bitcast", list(inst.operands), inst.shape,
                            {k: v for k, v in inst.attrs.items() if k in ("metadata", "sharding",
                                                                          "frontend_attributes")})
            b.control_predecessors = list(inst.control_predecessors)
            comp.insert_before(b, inst)
            for other in comp.instructions:
                if inst in other.control_predecessors:
                    other.control_predecessors[other.control_predecessors.index(inst)] = b
            comp.replace_instruction(inst, b)
            self.stats[key] += 1


__all__ = ["LayoutAssignment", "TargetRules", "GPU_TARGETS", "CPU_TARGETS"]

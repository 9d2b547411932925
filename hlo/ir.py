"""The HLO graph: ``Instruction``, ``Computation``, ``Module``.

Invariants kept by every mutation method here (and checked by ``hlo.verify``):
- ``inst.users`` lists each instruction that uses ``inst`` exactly once, in insertion order;
- every operand belongs to the same computation as its user;
- a computation's ``instructions`` are in an order where operands come before users (the
  order is the schedule when the module ``is_scheduled``);
- instruction and computation names are unique within the module.
"""
from __future__ import annotations

import itertools
import operator
from typing import Any, Collection, Iterable, Iterator, Optional

import numpy as np

from .attrs import COMPUTATION_ATTRS, FrontendAttributes, Metadata
from .errors import HlotkError
from .ops import OpDef, get_op
from .shape import AnyShape


class IRError(HlotkError):
    """Misuse of the IR API (e.g. removing an instruction that still has users)."""


_ids = itertools.count()
_CONTROL_PREDECESSORS = operator.attrgetter("control_predecessors")
_COMPUTATION_ATTR_SET = frozenset(COMPUTATION_ATTRS)


class Instruction:
    """One HLO instruction. ``attrs`` holds everything XLA prints after the operands."""

    __slots__ = ("name", "opcode", "operands", "shape", "attrs", "users", "parent",
                 "literal", "parameter_number", "control_predecessors", "uid", "__weakref__")

    def __init__(self, opcode: str, operands: Iterable["Instruction"], shape: AnyShape,
                 attrs: Optional[dict[str, Any]] = None, name: Optional[str] = None,
                 literal: Optional[np.ndarray] = None, parameter_number: Optional[int] = None):
        get_op(opcode)  # raises on an unknown opcode
        self.opcode = opcode
        self.operands: list[Instruction] = []
        self.shape = shape
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.users: list[Instruction] = []
        self.parent: Optional[Computation] = None
        self.name = name or ""
        # constant: a numpy array of the shape's dtype/dims (tuple of arrays for tuple
        # constants); None when XLA elided it as ``{...}``.
        self.literal = literal
        self.parameter_number = parameter_number
        self.control_predecessors: list[Instruction] = []
        self.uid = next(_ids)
        for op in operands:
            self._append_operand(op)

    def __setstate__(self, state: Any) -> None:
        # A uid is unique within one process only (passes and executables key tables by
        # it): an instruction unpickled from another process's module cache takes a fresh
        # one, else it could equal one this process has already handed out.
        slots = state[1] if isinstance(state, tuple) else state
        for key, value in (slots or {}).items():
            setattr(self, key, value)
        self.uid = next(_ids)

    # --- structure ----------------------------------------------------------------------
    @property
    def op(self) -> OpDef:
        return get_op(self.opcode)

    def _append_operand(self, op: "Instruction") -> None:
        if not isinstance(op, Instruction):
            raise IRError(f"operand of {self.opcode} must be an Instruction, got {type(op).__name__}")
        self.operands.append(op)
        if self not in op.users:
            op.users.append(self)

    def replace_operand(self, index: int, new: "Instruction") -> None:
        old = self.operands[index]
        self.operands[index] = new
        if self not in new.users:
            new.users.append(self)
        if old is not new and all(o is not old for o in self.operands):
            old.users.remove(self)

    def replace_operand_with(self, old: "Instruction", new: "Instruction") -> None:
        """Replace every occurrence of ``old`` among the operands with ``new``."""
        for i, o in enumerate(self.operands):
            if o is old:
                self.replace_operand(i, new)

    def replace_operands(self, new_for: dict[int, "Instruction"]) -> None:
        """``replace_operand_with(o, new_for[id(o)])`` for each operand ``o`` whose id is in
        ``new_for`` (the same operands and users lists), in one pass: a tuple of 600
        outputs had each replacement scan all its operands (fusion's materialize)."""
        replaced: dict[int, Instruction] = {}
        operands = self.operands
        for i, o in enumerate(operands):
            new = new_for.get(id(o))
            if new is not None and new is not o:
                operands[i] = new
                replaced[id(o)] = o
                if self not in new.users:
                    new.users.append(self)
        if replaced:
            still = {id(o) for o in operands}
            for oid, old in replaced.items():
                if oid not in still:
                    old.users.remove(self)

    def replace_all_uses_with(self, new: "Instruction") -> None:
        """Every user of self uses ``new`` instead; if self is a root, ``new`` becomes root."""
        if new is self:
            return
        for user in list(self.users):
            user.replace_operand_with(self, new)
        if self.parent is not None and self.parent.root is self:
            self.parent.root = new

    def drop_operands(self) -> None:
        for o in self.operands:
            if self in o.users:
                o.users.remove(self)
        self.operands = []

    @property
    def called_computations(self) -> list["Computation"]:
        out: list[Computation] = []
        if self.attrs.keys().isdisjoint(_COMPUTATION_ATTR_SET):
            return out      # most instructions call nothing (asked for every instruction
            #                 by the verifier, the printer and most passes)
        for key in COMPUTATION_ATTRS:
            v = self.attrs.get(key)
            if isinstance(v, Computation):
                out.append(v)
            elif isinstance(v, (tuple, list)):
                out.extend(c for c in v if isinstance(c, Computation))
        return out

    @property
    def is_root(self) -> bool:
        return self.parent is not None and self.parent.root is self

    @property
    def metadata(self) -> Metadata:
        return self.attrs.get("metadata") or Metadata()

    @property
    def sharding(self) -> Any:
        return self.attrs.get("sharding")

    @property
    def frontend_attributes(self) -> FrontendAttributes:
        return self.attrs.get("frontend_attributes") or FrontendAttributes()

    @property
    def is_side_effecting(self) -> bool:
        if self.opcode == "custom-call":
            return bool(self.attrs.get("custom_call_has_side_effect"))
        return self.op.side_effecting

    def reads_any(self, opcodes: Collection[str]) -> bool:
        """Whether this instruction or anything it reads, transitively through operands,
        has an opcode in ``opcodes``."""
        stack, seen = [self], set()
        while stack:
            v = stack.pop()
            if id(v) in seen:
                continue
            seen.add(id(v))
            if v.opcode in opcodes:
                return True
            stack.extend(v.operands)
        return False

    def to_text(self, **options: Any) -> str:
        from .text.printer import print_instruction
        return print_instruction(self, **options)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"<Instruction %{self.name} = {self.shape} {self.opcode}>"


def _in_order(insts: list["Instruction"], pos: dict[int, int]) -> bool:
    """Whether every operand and control predecessor of ``insts[k]`` is ``insts[j]`` for
    some j < k (``pos``: id -> position of each of ``insts``)."""
    get = pos.get
    for k, inst in enumerate(insts):
        for o in inst.operands:
            j = get(id(o))
            if j is None or j >= k:
                return False
        if inst.control_predecessors:
            for o in inst.control_predecessors:
                j = get(id(o))
                if j is None or j >= k:
                    return False
    return True


class Computation:
    """A list of instructions with parameters and a root; the entry or a called body."""

    def __init__(self, name: str):
        self.name = name
        self.instructions: list[Instruction] = []
        self.parameters: list[Instruction] = []   # by parameter number
        self.root: Optional[Instruction] = None
        self.parent: Optional[Module] = None
        # The fusion instruction this computation is the body of, if any.
        self.fusion_instruction: Optional[Instruction] = None
        # True when parsed with ``execution_thread=...`` etc.; extra signature text verbatim.
        self.extra_attrs: str = ""

    # --- building -----------------------------------------------------------------------
    def add_instruction(self, inst: Instruction, name: Optional[str] = None) -> Instruction:
        """Append ``inst`` (its operands must already be in this computation)."""
        if inst.parent is not None:
            raise IRError(f"%{inst.name} already belongs to %{inst.parent.name}")
        for o in inst.operands:
            if o.parent is not self:
                raise IRError(f"operand %{o.name} of new {inst.opcode} is not in %{self.name}")
        inst.parent = self
        if name is not None:
            inst.name = name
        if self.parent is not None:
            inst.name = self.parent.unique_name(inst.name or inst.opcode.replace("-", "_"))
        elif not inst.name:
            inst.name = f"{inst.opcode.replace('-', '_')}.{inst.uid}"
        if inst.opcode == "parameter":
            n = inst.parameter_number
            if n is None:
                n = inst.parameter_number = len(self.parameters)
            while len(self.parameters) <= n:
                self.parameters.append(None)  # type: ignore[arg-type]
            if self.parameters[n] is not None:
                raise IRError(f"%{self.name} already has parameter({n}): %{self.parameters[n].name}")
            self.parameters[n] = inst
        self.instructions.append(inst)
        return inst

    def insert_before(self, inst: Instruction, anchor: Instruction) -> Instruction:
        """Add ``inst`` and place it just before ``anchor`` in the instruction order."""
        self.add_instruction(inst)
        self.instructions.remove(inst)
        self.instructions.insert(self.instructions.index(anchor), inst)
        return inst

    def _check_removable(self, inst: Instruction) -> None:
        if inst.users:
            raise IRError(f"cannot remove %{inst.name}: still used by "
                          + ", ".join("%" + u.name for u in inst.users))
        if inst is self.root:
            raise IRError(f"cannot remove the root %{inst.name} of %{self.name}")
        if inst.opcode == "parameter":
            raise IRError(f"cannot remove parameter %{inst.name}")

    def remove_instruction(self, inst: Instruction) -> None:
        self._check_removable(inst)
        inst.drop_operands()
        # the non-empty control predecessor lists, found without a Python loop over every
        # instruction (issue 13: CSE and fusion remove hundreds, each walked them all)
        for cps in filter(None, map(_CONTROL_PREDECESSORS, self.instructions)):
            if inst in cps:
                cps.remove(inst)
        self.instructions.remove(inst)
        if self.parent is not None:
            self.parent._discard_name(inst.name)
        inst.parent = None

    def remove_instructions(self, insts: Iterable[Instruction]) -> None:
        """``remove_instruction`` of each of ``insts``, in that order (each must have no
        users once the ones before it are gone), with one walk over the computation for
        them all instead of one each (issue 13: fusion removes ~450 fused instructions of
        the Adam step). Should one be refused (IRError), those before it are removed."""
        done: list[Instruction] = []
        try:
            for inst in insts:
                self._check_removable(inst)
                inst.drop_operands()
                done.append(inst)
        finally:
            gone = {id(i) for i in done}
            for cps in filter(None, map(_CONTROL_PREDECESSORS, self.instructions)):
                if any(id(c) in gone for c in cps):
                    for inst in done:          # as one remove_instruction each would
                        if inst in cps:
                            cps.remove(inst)
            self.instructions[:] = [i for i in self.instructions if id(i) not in gone]
            for inst in done:
                if self.parent is not None:
                    self.parent._discard_name(inst.name)
                inst.parent = None

    def replace_all_uses_with(self, old: Instruction, new: Instruction) -> None:
        old.replace_all_uses_with(new)

    def replace_instruction(self, old: Instruction, new: Instruction) -> None:
        """Use ``new`` (added if needed) in place of ``old`` and remove ``old``."""
        if new.parent is None:
            self.insert_before(new, old)
        old.replace_all_uses_with(new)
        self.remove_instruction(old)

    def remove_dead(self) -> int:
        """Remove instructions that do not reach the root and have no side effects."""
        live: set[int] = set()
        stack = [self.root] if self.root is not None else []
        stack += [i for i in self.instructions if i.is_side_effecting or i.opcode == "parameter"]
        while stack:
            i = stack.pop()
            if id(i) in live:
                continue
            live.add(id(i))
            stack.extend(i.operands)
            stack.extend(i.control_predecessors)
        # Users before their operands (the list reversed); the list itself is filtered once
        # at the end (issue 13: one ``list.remove`` each was most of DCE's time).
        dead = [inst for inst in reversed(self.instructions) if id(inst) not in live]
        for inst in dead:
            inst.drop_operands()
            if self.parent is not None:
                self.parent._discard_name(inst.name)
            inst.parent = None
        if dead:
            self.instructions[:] = [i for i in self.instructions if id(i) in live]
        for inst in self.instructions:
            for u in inst.users:
                if u.parent is not self:        # rare: rebuilt without every such user
                    inst.users[:] = [v for v in inst.users if v.parent is self]
                    break
        return len(dead)

    # --- queries ------------------------------------------------------------------------
    def post_order(self) -> list[Instruction]:
        """Instructions in an order where operands (and control predecessors) come first:
        depth first from each instruction in list order, operands in order."""
        insts = self.instructions
        # A list whose every instruction's operands and control predecessors come earlier
        # in it is its own post order: the walk from each instruction finds every operand
        # already emitted and emits the instruction at once. Checking that is a third of
        # the walk, and most lists pass it (the schedule pass orders every fusion body;
        # layout assignment, inline, the fusion pass walk computations that are in order):
        # issue 13, ~10k instructions of an AdamW step over 200 arrays.
        pos = {id(i): k for k, i in enumerate(insts)}
        if len(pos) == len(insts) and _in_order(insts, pos):
            return list(insts)
        seen: set[int] = set()
        order: list[Instruction] = []
        for start in self.instructions:
            if id(start) in seen:
                continue
            stack: list[tuple[Instruction, bool]] = [(start, False)]
            while stack:
                inst, done = stack.pop()
                if done:
                    order.append(inst)
                    continue
                if id(inst) in seen:
                    continue
                seen.add(id(inst))
                stack.append((inst, True))
                for o in reversed(inst.operands + inst.control_predecessors):
                    if id(o) not in seen:
                        stack.append((o, False))
        return order

    @property
    def parameter_shapes(self) -> list[AnyShape]:
        return [p.shape for p in self.parameters]

    @property
    def result_shape(self) -> AnyShape:
        assert self.root is not None
        return self.root.shape

    @property
    def is_entry(self) -> bool:
        return self.parent is not None and self.parent.entry is self

    def get(self, name: str) -> Instruction:
        for i in self.instructions:
            if i.name == name:
                return i
        raise KeyError(f"no instruction %{name} in %{self.name}")

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)

    def __len__(self) -> int:
        return len(self.instructions)

    def to_text(self, **options: Any) -> str:
        from .text.printer import print_computation
        return print_computation(self, **options)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"<Computation %{self.name}: {len(self.instructions)} instructions>"

    def _repr_html_(self) -> str:
        from .render import repr_html
        return repr_html(self)

    def to_networkx(self) -> Any:
        """This computation as a ``networkx.MultiDiGraph`` (see ``hlo.graph``)."""
        from .graph import computation_to_networkx
        return computation_to_networkx(self)


# Attribute values deep-copied as themselves: immutable (the imported module's metadata,
# one record per source line, is most of an instruction's attributes).
_KEPT = frozenset({str, int, float, bool, type(None), Metadata, FrontendAttributes})


def _copy_attrs(attrs: dict[str, Any], memo: dict[int, Any]) -> dict[str, Any]:
    """``copy.deepcopy(attrs, memo)``, the immutable values kept as they are (issue 13:
    deepcopy rebuilt every metadata record, ~40% of copying the Adam step)."""
    import copy as copy_mod
    return {k: v if type(v) in _KEPT else copy_mod.deepcopy(v, memo) for k, v in attrs.items()}


def _as_printed(shape: AnyShape) -> AnyShape:
    """``shape`` as the parser reads it back from its text: a layout the printer leaves
    out (a scalar's ``{}``, a token's) is read back as none."""
    if shape.is_tuple:
        elements = tuple(_as_printed(e) for e in shape.elements)
        if all(a is b for a, b in zip(elements, shape.elements)):
            return shape
        return type(shape)(elements)
    layout = shape.layout
    if layout is None or (shape.dims and shape.dtype.is_array_type) \
            or (layout.extra and not shape.dims):
        return shape
    return shape.with_layout(None)


class Module:
    """An HLO module: computations (called ones first, as XLA prints them) and an entry."""

    def __init__(self, name: str):
        self.name = name
        self.computations: list[Computation] = []
        self.entry: Optional[Computation] = None
        # Header attributes after the name (``is_scheduled``, ``entry_computation_layout``,
        # ``input_output_alias``, ``replica_count``, ``num_partitions``,
        # ``frontend_attributes`` ...): name -> typed value or attrs.Raw, printing order.
        self.config: dict[str, Any] = {}
        # ``FileNames``/``FunctionNames``/``FileLocations``/``StackFrames`` sections: kept as
        # parsed lines (``id -> text``) so metadata's stack_frame_id stays meaningful.
        self.sections: dict[str, list[tuple[int, str]]] = {}
        self._names: set[str] = set()
        # Computation names live apart from instruction names, as in XLA (a computation
        # %fft.1 and an instruction %fft.1 may coexist in one module).
        self._computation_names: set[str] = set()

    def unique_name(self, base: str) -> str:
        """``base`` if unused in this module, else ``base.N`` for the first free N."""
        name = base
        if name in self._names:
            # The search starts where the last one for this base ended: every N below is
            # taken (``_discard_name`` lowers it when one is freed). Without it, naming the
            # k-th "fusion" tried k names (issue 13: 2,000 fusions, 2 M tries).
            floors = self.__dict__.setdefault("_name_floors", {})   # (pickled modules)
            stem = base
            n = floors.get(stem, 1)
            while f"{stem}.{n}" in self._names:
                n += 1
            name = f"{stem}.{n}"
            floors[stem] = n + 1
        self._names.add(name)
        return name

    def _discard_name(self, name: str) -> None:
        """``name`` is free again (its instruction left the module)."""
        self._names.discard(name)
        floors = self.__dict__.get("_name_floors")
        stem, dot, tail = name.rpartition(".")
        if floors and dot and tail.isdigit() and floors.get(stem, 0) > int(tail):
            floors[stem] = int(tail)

    def unique_computation_name(self, base: str) -> str:
        """Like ``unique_name``, among computation names."""
        name, n = base, 1
        while name in self._computation_names:
            name = f"{base}.{n}"
            n += 1
        self._computation_names.add(name)
        return name

    def add_computation(self, comp: Computation, entry: bool = False) -> Computation:
        if comp.parent is not None and comp.parent is not self:
            raise IRError(f"computation %{comp.name} belongs to another module")
        if comp in self.computations:
            raise IRError(f"computation %{comp.name} already in module")
        comp.parent = self
        comp.name = self.unique_computation_name(comp.name)
        for inst in comp.instructions:
            if inst.name in self._names:
                inst.name = self.unique_name(inst.name)
            else:
                self._names.add(inst.name)
        self.computations.append(comp)
        if entry:
            self.entry = comp
            # The entry prints last.
            self.computations.remove(comp)
            self.computations.append(comp)
        return comp

    def clone_computation(self, comp: Computation, suffix: str = ".clone") -> Computation:
        """Copy ``comp`` into this module under a fresh name, placed right after it (callees
        print before callers); the copy calls the same computations the original calls."""
        new = Computation(comp.name + suffix)
        mapping: dict[int, Instruction] = {}
        for inst in comp.instructions:
            c = Instruction(inst.opcode, [mapping[id(o)] for o in inst.operands], inst.shape,
                            dict(inst.attrs), name=inst.name, literal=inst.literal,
                            parameter_number=inst.parameter_number)
            c.control_predecessors = [mapping[id(p)] for p in inst.control_predecessors]
            new.add_instruction(c)
            mapping[id(inst)] = c
        assert comp.root is not None
        new.root = mapping[id(comp.root)]
        self.add_computation(new)
        self.computations.remove(new)
        self.computations.insert(self.computations.index(comp) + 1, new)
        return new

    def remove_computation(self, comp: Computation) -> None:
        if comp is self.entry:
            raise IRError("cannot remove the entry computation")
        self.computations.remove(comp)
        self._computation_names.discard(comp.name)
        comp.parent = None

    def computation(self, name: str) -> Computation:
        for c in self.computations:
            if c.name == name:
                return c
        raise KeyError(f"no computation %{name} in module {self.name}")

    def reachable_computations(self) -> list[Computation]:
        """Computations reachable from the entry, callees before callers."""
        order: list[Computation] = []
        seen: set[int] = set()

        def visit(c: Computation) -> None:
            if id(c) in seen:
                return
            seen.add(id(c))
            for inst in c.instructions:
                for callee in inst.called_computations:
                    visit(callee)
            order.append(c)
        if self.entry is not None:
            visit(self.entry)
        return order

    def remove_unreachable_computations(self) -> int:
        keep = {id(c) for c in self.reachable_computations()}
        dead = [c for c in self.computations if id(c) not in keep]
        for c in dead:
            self.remove_computation(c)
        return len(dead)

    def all_instructions(self) -> Iterator[Instruction]:
        for c in self.computations:
            yield from c.instructions

    @property
    def is_scheduled(self) -> bool:
        return bool(self.config.get("is_scheduled"))

    def clone(self) -> "Module":
        """A deep copy (through the text format, which is lossless for hlotk's IR)."""
        from .text.parser import parse_hlo
        return parse_hlo(self.to_text())

    def copy(self) -> "Module":
        """A deep copy built object by object, as ``clone`` would parse it back from the
        printed text, without printing and parsing (issue 13: ``clone`` of the Adam step's
        637 instructions took ~0.1 s, the copy ~0.01 s). As the parser does: non-entry
        computations in order and the entry last, instructions in order with fresh uids,
        users rebuilt from the operands in that order, names registered again from the live
        instructions, layouts the text leaves out (a scalar's) dropped,
        ``fusion_instruction`` set on each fusion's ``calls``, and nothing that the text
        does not hold (attributes set on the objects by passes) carried over. Attribute
        values and literals are deep copies (the called computations mapped to the
        copies); shapes are shared (immutable)."""
        import copy as copy_mod
        new = Module(self.name)
        new.config = copy_mod.deepcopy(self.config)
        new.sections = {k: list(v) for k, v in self.sections.items()}
        order = [c for c in self.computations if c is not self.entry]
        if self.entry is not None:
            order.append(self.entry)
        # deepcopy's memo maps the old computations to the new ones inside attribute values.
        memo: dict[int, Any] = {}
        comps = []
        for comp in order:
            c = Computation(comp.name)
            c.extra_attrs = comp.extra_attrs
            memo[id(comp)] = c
            comps.append(c)
        for comp, c in zip(order, comps):
            new.add_computation(c)
            mapping: dict[int, Instruction] = {}
            for inst in comp.instructions:
                literal = inst.literal
                if literal is not None:
                    literal = copy_mod.deepcopy(literal)
                i = Instruction(inst.opcode, [mapping[id(o)] for o in inst.operands],
                                _as_printed(inst.shape), _copy_attrs(inst.attrs, memo),
                                name=inst.name,
                                literal=literal, parameter_number=inst.parameter_number)
                i.control_predecessors = [mapping[id(p)] for p in inst.control_predecessors]
                c.add_instruction(i)
                mapping[id(inst)] = i
            c.root = mapping[id(comp.root)] if comp.root is not None else None
        if self.entry is not None:
            new.entry = comps[-1]
        for inst in new.all_instructions():
            if inst.opcode == "fusion" and isinstance(inst.attrs.get("calls"), Computation):
                inst.attrs["calls"].fusion_instruction = inst
        return new

    def to_text(self, **options: Any) -> str:
        from .text.printer import print_module
        return print_module(self, **options)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"<Module {self.name}: {len(self.computations)} computations>"

    def to_networkx(self) -> Any:
        """Every computation's instructions as one ``networkx.MultiDiGraph``, with call
        edges from callee roots to callers (see ``hlo.graph``)."""
        from .graph import module_to_networkx
        return module_to_networkx(self)

    # Jupyter shows a module as its graph (or its text when graphviz is missing).
    def _repr_html_(self) -> str:
        from .render import repr_html
        return repr_html(self)

"""Thunks: the steps of a compiled CPU executable, each reading and writing arena memory.

Every array leaf of every value lives at the ``(allocation, offset)`` buffer assignment gave
it, as PHYSICAL bytes (the shape's layout; row-major when none). A thunk reads its operands
from memory as logical numpy arrays, computes, and writes its result leaves back. Nothing is
passed from one thunk to the next except through memory, so a wrong assignment (two live
values at the same bytes) gives a wrong answer.

Kinds (as XLA's thunk sequence): ``KernelThunk`` (a fusion: the CPU code generator's kernel,
or the fused computation interpreted when no code generator is present), ``LibraryCallThunk``
(dot through numpy's matmul, or the target's library kernel), ``LibraryFusionThunk`` (a GEMM
fusion whose dot is the target's library call), ``CopyThunk``, ``WhileThunk`` /
``ConditionalThunk`` / ``CallThunk`` holding their own sequences, ``FallbackThunk`` (one
instruction run with its interpreter rule) and ``AsyncStartThunk`` / ``AsyncDoneThunk`` (an
asynchronous collective running in a background thread between its start and its done).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from hlo.evaluator.core import TOKEN, EvalContext
from hlo.ir import Instruction
from hlo.layout_util import from_physical, is_default, physical_dims, to_physical
from hlo.shape import AnyShape, Shape, leaf_paths

Index = tuple[int, ...]


@dataclass(frozen=True)
class Slot:
    """Where one array leaf lives: allocation number, byte offset, and its shape."""
    allocation: int
    offset: int
    shape: Shape

    @property
    def nbytes(self) -> int:
        return self.shape.size * self.shape.dtype.np_dtype.itemsize


class Memory:
    """The byte buffers of one run: allocation number -> flat uint8 array."""

    def __init__(self, buffers: list[np.ndarray]):
        self.buffers = buffers

    def view(self, slot: Slot) -> np.ndarray:
        """The physical array at ``slot`` (a view: writing to it writes memory)."""
        s = slot.shape
        raw = self.buffers[slot.allocation][slot.offset:slot.offset + slot.nbytes]
        return raw.view(s.dtype.np_dtype).reshape(physical_dims(s))

    def read(self, slot: Slot) -> np.ndarray:
        phys = self.view(slot)
        if is_default(slot.shape.layout):
            out = phys.reshape(slot.shape.dims)
            out = out.view()
            out.flags.writeable = False   # a rule writing into an operand is a bug
            return out
        return from_physical(phys, slot.shape)

    def write(self, slot: Slot, value: Any) -> None:
        s = slot.shape
        arr = np.asarray(value)
        if arr.dtype != s.dtype.np_dtype:
            arr = arr.astype(s.dtype.np_dtype)
        arr = arr.reshape(s.dims)
        dst = self.view(slot)
        # numpy copes with overlapping source and destination (in-place sharing).
        dst[...] = arr if is_default(s.layout) else to_physical(arr, s.layout)


class Slots:
    """Leaf slots of each instruction, and reading/writing whole (tuple) values."""

    def __init__(self, table: dict[int, dict[Index, Slot]]):
        self.table = table

    def leaves(self, inst: Instruction) -> dict[Index, Slot]:
        return self.table[inst.uid]

    def read(self, mem: Memory, inst: Instruction) -> Any:
        return _build(inst.shape, (), self.table[inst.uid], mem)

    def write(self, mem: Memory, inst: Instruction, value: Any) -> None:
        slots = self.table[inst.uid]
        if not slots:
            return
        if len(slots) == 1 and () in slots:
            mem.write(slots[()], value)
            return
        # Several leaves: take private copies first, so that writing one leaf cannot
        # change another leaf's value (a view of an operand that shares bytes with it).
        leaves = [(ix, np.array(_pick(value, ix))) for ix in slots]
        for ix, v in leaves:
            mem.write(slots[ix], v)


def _pick(value: Any, index: Index) -> Any:
    for i in index:
        value = value[i]
    return value


def _build(shape: AnyShape, prefix: Index, slots: dict[Index, Slot], mem: Memory) -> Any:
    if shape.is_tuple:
        return tuple(_build(e, prefix + (i,), slots, mem) for i, e in enumerate(shape.elements))
    if not shape.is_array:
        return TOKEN
    return mem.read(slots[prefix])


class Thunk:
    kind = "thunk"

    def __init__(self, inst: Instruction):
        self.inst = inst

    def run(self, mem: Memory, slots: Slots, ctx: EvalContext) -> None:
        raise NotImplementedError

    def describe(self, depth: int = 0) -> str:
        return "  " * depth + f"{self.kind} %{self.inst.name}"


class FallbackThunk(Thunk):
    """One instruction run by its interpreter rule."""
    kind = "fallback"

    def run(self, mem: Memory, slots: Slots, ctx: EvalContext) -> None:
        inst = self.inst
        operands = [slots.read(mem, o) for o in inst.operands]
        value = inst.op.evaluate(inst, operands, ctx)
        slots.write(mem, inst, value)


class AsyncState(threading.local):
    """The collectives in flight on one thread (one device's run): start uid -> the
    background thread computing it and the box its value lands in."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple[threading.Thread, list]] = {}


class AsyncStartThunk(Thunk):
    """An asynchronous collective's start: its operands are read now, and the collective
    runs in a background thread (meeting the other devices there) while this device's
    next thunks run. Nothing is written: the start's element 0 is the operands' own buffer,
    and its result is written by the done."""
    kind = "async-start"

    def __init__(self, inst: Instruction, state: AsyncState):
        super().__init__(inst)
        self.state = state

    def run(self, mem: Memory, slots: Slots, ctx: EvalContext) -> None:
        inst = self.inst
        operands = [np.array(slots.read(mem, o)) for o in inst.operands]
        box: list = []

        def work() -> None:
            try:
                box.append(("ok", inst.op.evaluate(inst, operands, ctx)))
            except BaseException as e:   # noqa: BLE001  (raised again by the done)
                box.append(("error", e))
        t = threading.Thread(target=work, name=f"hlotk-{inst.name}", daemon=True)
        t.start()
        self.state.pending[inst.uid] = (t, box)


class AsyncDoneThunk(Thunk):
    """Waits for its start's collective and writes the result (the start's result buffer,
    which the done aliases)."""
    kind = "async-done"

    def __init__(self, inst: Instruction, state: AsyncState):
        super().__init__(inst)
        self.state = state

    def run(self, mem: Memory, slots: Slots, ctx: EvalContext) -> None:
        start = self.inst.operands[0]
        t, box = self.state.pending.pop(start.uid)
        t.join()
        status, value = box[0]
        if status == "error":
            raise value
        if start.opcode != "all-reduce-start":
            value = value[1]                # ((operands), result, context...)
        slots.write(mem, self.inst, value)


class LibraryCallThunk(FallbackThunk):
    """A library call: the target's kernel for the instruction (``codegen.library``, e.g.
    the Pallas blocked matmul for target ``tpu``) when one is given, else numpy's matmul
    (the interpreter's dot rule is exactly that)."""
    kind = "library-call"

    def __init__(self, inst: Instruction, call: Optional[Callable] = None):
        super().__init__(inst)
        self.call = call          # fn(inst, operands) -> value

    def run(self, mem: Memory, slots: Slots, ctx: EvalContext) -> None:
        if self.call is None:
            return super().run(mem, slots, ctx)
        inst = self.inst
        operands = [slots.read(mem, o) for o in inst.operands]
        slots.write(mem, inst, self.call(inst, operands))

    def describe(self, depth: int = 0) -> str:
        name = "numpy" if self.call is None else getattr(self.call, "__name__", "library")
        return "  " * depth + f"{self.kind} %{self.inst.name} ({name})"


class LibraryFusionThunk(Thunk):
    """A GEMM fusion on a target with a dot library call (tpu): the fused computation runs
    instruction by instruction, its one dot through the library kernel and the prologue /
    epilogue around it through their interpreter rules (XLA:TPU's output fusion, with the
    elementwise parts not compiled into the kernel)."""
    kind = "library-call"

    def __init__(self, inst: Instruction, dot: Instruction, call: Callable):
        super().__init__(inst)
        self.dot, self.call = dot, call

    def run(self, mem: Memory, slots: Slots, ctx: EvalContext) -> None:
        inst = self.inst
        comp = inst.attrs["calls"]
        env = {id(p): slots.read(mem, o) for p, o in zip(comp.parameters, inst.operands)}
        for i in comp.instructions:
            if i.opcode == "parameter":
                continue
            ops = [env[id(o)] for o in i.operands]
            env[id(i)] = self.call(i, ops) if i is self.dot else i.op.evaluate(i, ops, ctx)
        slots.write(mem, inst, env[id(comp.root)])

    def describe(self, depth: int = 0) -> str:
        rest = sorted({i.opcode for i in self.inst.attrs["calls"].instructions
                       if i is not self.dot and i.opcode != "parameter"})
        return ("  " * depth + f"{self.kind} %{self.inst.name} "
                f"({getattr(self.call, '__name__', 'library')} + {', '.join(rest) or 'nothing'})")


class CopyThunk(Thunk):
    kind = "copy"

    def run(self, mem: Memory, slots: Slots, ctx: EvalContext) -> None:
        src = slots.read(mem, self.inst.operands[0])
        slots.write(mem, self.inst, src)


class KernelThunk(Thunk):
    """A fusion: one kernel from the CPU code generator, or the fused computation run by
    the interpreter when ``codegen.cpu`` is not available."""
    kind = "kernel"

    def __init__(self, inst: Instruction):
        super().__init__(inst)
        self.kernel: Optional[Callable] = None
        try:
            from codegen.cpu import compile_fusion
        except ImportError:
            compile_fusion = None
        if compile_fusion is not None:
            from hlo.errors import HlotkError
            try:
                self.kernel = compile_fusion(inst)
            except HlotkError:
                self.kernel = None   # a fusion the code generator cannot emit: interpret it

    def run(self, mem: Memory, slots: Slots, ctx: EvalContext) -> None:
        inst = self.inst
        operands = [slots.read(mem, o) for o in inst.operands]
        if self.kernel is not None:
            value = self.kernel(*operands)
        else:
            value = ctx.call(inst.attrs["calls"], operands)
        slots.write(mem, inst, value)

    def describe(self, depth: int = 0) -> str:
        name = getattr(self.kernel, "name", "interpreted")
        return "  " * depth + f"{self.kind} %{self.inst.name} ({name})"


class SequenceThunk(Thunk):
    kind = "sequence"

    def __init__(self, inst: Optional[Instruction], thunks: list[Thunk]):
        self.inst = inst  # type: ignore[assignment]
        self.thunks = thunks

    def run(self, mem: Memory, slots: Slots, ctx: EvalContext) -> None:
        for t in self.thunks:
            t.run(mem, slots, ctx)

    def describe(self, depth: int = 0) -> str:
        return "\n".join(t.describe(depth) for t in self.thunks)


class WhileThunk(Thunk):
    """Runs condition and body sequences over the loop state, which stays in one buffer."""
    kind = "while"

    def __init__(self, inst: Instruction, cond: SequenceThunk, body: SequenceThunk):
        super().__init__(inst)
        self.cond, self.body = cond, body

    def run(self, mem: Memory, slots: Slots, ctx: EvalContext) -> None:
        cond_root = self.inst.attrs["condition"].root
        while True:
            self.cond.run(mem, slots, ctx)
            if not bool(slots.read(mem, cond_root)):
                break
            self.body.run(mem, slots, ctx)

    def describe(self, depth: int = 0) -> str:
        pad = "  " * depth
        return (f"{pad}while %{self.inst.name}\n{pad} condition:\n{self.cond.describe(depth + 1)}"
                f"\n{pad} body:\n{self.body.describe(depth + 1)}")


class ConditionalThunk(Thunk):
    kind = "conditional"

    def __init__(self, inst: Instruction, branches: list[SequenceThunk], indexed: bool):
        super().__init__(inst)
        self.branches, self.indexed = branches, indexed

    def run(self, mem: Memory, slots: Slots, ctx: EvalContext) -> None:
        sel = np.asarray(slots.read(mem, self.inst.operands[0]))
        if sel.dtype == np.bool_:
            k = 0 if bool(sel) else 1   # {true, false}, as XLA orders them
        else:
            k = int(sel)
            if k < 0 or k >= len(self.branches):
                k = len(self.branches) - 1
        self.branches[k].run(mem, slots, ctx)

    def describe(self, depth: int = 0) -> str:
        pad = "  " * depth
        return f"{pad}conditional %{self.inst.name}\n" + "\n".join(
            f"{pad} branch {k}:\n{b.describe(depth + 1)}" for k, b in enumerate(self.branches))


class CallThunk(Thunk):
    kind = "call"

    def __init__(self, inst: Instruction, callee: SequenceThunk):
        super().__init__(inst)
        self.callee = callee

    def run(self, mem: Memory, slots: Slots, ctx: EvalContext) -> None:
        self.callee.run(mem, slots, ctx)

    def describe(self, depth: int = 0) -> str:
        return "  " * depth + f"call %{self.inst.name}\n" + self.callee.describe(depth + 1)


def leaf_shapes(shape: AnyShape) -> list[tuple[Index, Shape]]:
    return [(ix, s) for ix, s in leaf_paths(shape) if s.is_array]

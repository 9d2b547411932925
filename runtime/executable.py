"""The CPU executable: a thunk sequence over one arena, built from a buffer assignment.

    exe = CpuExecutable.build(module)          # module scheduled (``schedule`` pass)
    outs = exe.run([x, y])                     # logical numpy arrays in, flattened out

Memory of one run: the temp arena (one uint8 array of ``assignment.temp_size`` bytes, every
temporary a view at its offset), one buffer per output allocation, the parameters' own
bytes (physical, read-only unless donated) and the constants (filled once, read-only).
``poison=True`` (or ``HLOTK_POISON_ARENA=1``) fills the arena and the output buffers with
0xFF bytes (NaN for floats, -1 for integers) before each run, so that reading a value that
was never written, or was overwritten, shows up in the result.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np

from hlo.errors import InvalidArgumentError
from hlo.evaluator.core import EvalContext, Evaluator
from hlo.ir import Computation, Instruction, Module
from hlo.layout_util import to_physical
from hlo.shape import leaf_paths
from hlo.limits import check_arena, check_module, host_memory_bytes
from passes.buffer_assignment import BufferAssignment, assign_buffers
from passes.dataflow import array_leaves

from .thunks import (AsyncDoneThunk, AsyncStartThunk, AsyncState, CallThunk, ConditionalThunk,
                     CopyThunk, FallbackThunk, KernelThunk, LibraryCallThunk, LibraryFusionThunk,
                     Memory, SequenceThunk, Slot, Slots, Thunk, WhileThunk)

_NO_THUNK = {"parameter", "constant", "tuple", "get-tuple-element", "optimization-barrier"}
_LIBRARY_CALLS = {"dot"}
_ASYNC_STARTS = {"all-reduce-start", "all-gather-start", "collective-permute-start", "async-start"}
_ASYNC_DONES = {"all-reduce-done", "all-gather-done", "collective-permute-done", "async-done"}


def poison_default() -> bool:
    return os.environ.get("HLOTK_POISON_ARENA", "") not in ("", "0", "false", "False")


class CpuExecutable:
    def __init__(self, module: Module, assignment: BufferAssignment, poison: Optional[bool] = None,
                 target: Optional[str] = None):
        self.module = module
        self.target = target      # compile target: picks library calls (tpu: Pallas matmul)
        self.assignment = assignment
        self.poison = poison_default() if poison is None else poison
        a = assignment
        table: dict[int, dict] = {}
        for comp in a.flow.computations:
            for inst in comp.instructions:
                leaves = {}
                for ix, shape in array_leaves(inst.shape):
                    alloc, offset = a.slice(inst, ix)
                    leaves[ix] = Slot(alloc.index, offset, shape)
                table[inst.uid] = leaves
        self.slots = Slots(table)
        self.async_state = AsyncState()
        self.sequence = self._sequence(module.entry)
        self.parameter_slots = [
            [(ix, table[p.uid][ix]) for ix, _ in array_leaves(p.shape)]
            for p in module.entry.parameters]
        self.output_slots = [table[module.entry.root.uid][ix]
                             for ix, _ in array_leaves(module.entry.root.shape)]
        self.donated_parameters = sorted(set(a.aliased_outputs.values()))
        self._constants = self._constant_memory()

    @classmethod
    def build(cls, module: Module, poison: Optional[bool] = None,
              target: Optional[str] = None) -> "CpuExecutable":
        check_module(module)       # absurd shapes stop here, before the arena exists
        assignment = assign_buffers(module)
        check_arena(assignment.allocations, f"the buffer arena of {module.name}",
                    capacity=host_memory_bytes())
        return cls(module, assignment, poison, target)

    # --- building ------------------------------------------------------------------------
    def _sequence(self, comp: Computation) -> SequenceThunk:
        thunks: list[Thunk] = []
        for inst in comp.instructions:
            t = self._thunk(inst)
            if t is not None:
                thunks.append(t)
        return SequenceThunk(None, thunks)

    def _thunk(self, inst: Instruction) -> Optional[Thunk]:
        op = inst.opcode
        if op in _NO_THUNK:
            return None
        if op == "bitcast" and not self.slots.leaves(inst) == {} and \
                self._same_bytes(inst, inst.operands[0]):
            return None   # a view: same bytes, read with another shape
        if op == "while":
            return WhileThunk(inst, self._sequence(inst.attrs["condition"]),
                              self._sequence(inst.attrs["body"]))
        if op == "conditional":
            if "branch_computations" in inst.attrs:
                branches, indexed = list(inst.attrs["branch_computations"]), True
            else:
                branches = [inst.attrs["true_computation"], inst.attrs["false_computation"]]
                indexed = False
            return ConditionalThunk(inst, [self._sequence(b) for b in branches], indexed)
        if op == "call":
            return CallThunk(inst, self._sequence(inst.attrs["to_apply"]))
        if op == "fusion":
            return self._gemm_library_call(inst) or KernelThunk(inst)
        if op == "copy":
            return CopyThunk(inst)
        if op in _ASYNC_STARTS:
            return AsyncStartThunk(inst, self.async_state)
        if op in _ASYNC_DONES:
            return AsyncDoneThunk(inst, self.async_state)
        if op in _LIBRARY_CALLS:
            return LibraryCallThunk(inst, self._library_call(inst))
        return FallbackThunk(inst)

    def _library_call(self, inst: Instruction):
        """The target's library call for ``inst`` if it runs on host arrays: only the
        ``tpu`` calls do (Pallas, interpreted on the CPU); ``cuda`` calls need torch
        tensors on a GPU and belong to the CUDA backend."""
        from codegen.library import lookup, target_kind
        if target_kind(self.target) != "tpu":
            return None
        return lookup(self.target, inst)

    def _gemm_library_call(self, inst: Instruction) -> Optional[Thunk]:
        """A GEMM fusion whose dot the target has a library call for (tpu: the Pallas
        matmul) runs that call, with the rest of the fusion around it."""
        if self.target is None:
            return None
        from passes.fusion.kinds import fusion_kind
        if fusion_kind(inst) != "gemm":
            return None
        dots = [i for i in inst.attrs["calls"].instructions if i.opcode == "dot"]
        call = self._library_call(dots[0]) if len(dots) == 1 else None
        return LibraryFusionThunk(inst, dots[0], call) if call is not None else None

    def _same_bytes(self, a: Instruction, b: Instruction) -> bool:
        sa, sb = self.slots.leaves(a).get(()), self.slots.leaves(b).get(())
        return sa is not None and sb is not None and (sa.allocation, sa.offset) == \
            (sb.allocation, sb.offset)

    def _constant_memory(self) -> dict[int, np.ndarray]:
        mem: dict[int, np.ndarray] = {}
        for comp in self.assignment.flow.computations:
            for inst in comp.instructions:
                if inst.opcode != "constant" or inst.literal is None:
                    continue
                values = inst.literal
                for ix, shape in array_leaves(inst.shape):
                    slot = self.slots.leaves(inst)[ix]
                    v = values
                    for i in ix:
                        v = v[i]
                    v = np.asarray(v, dtype=shape.dtype.np_dtype).reshape(shape.dims)
                    raw = np.zeros(self.assignment.allocations[slot.allocation].size, np.uint8)
                    phys = to_physical(v, shape.layout)
                    raw[:phys.nbytes] = phys.reshape(-1).view(np.uint8)
                    raw.flags.writeable = False
                    mem[slot.allocation] = raw
        return mem

    # --- running -------------------------------------------------------------------------
    def _memory(self, args: list[Any], donated: frozenset[int]) -> Memory:
        a = self.assignment
        buffers: list[Optional[np.ndarray]] = [None] * len(a.allocations)
        fill = 0xFF if self.poison else None
        for alloc in a.allocations:
            if alloc.kind in ("temp", "output"):
                buf = np.empty(max(alloc.size, 1), np.uint8)
                if fill is not None:
                    buf.fill(fill)
                buffers[alloc.index] = buf
            elif alloc.kind == "constant":
                buffers[alloc.index] = self._constants.get(
                    alloc.index, np.zeros(max(alloc.size, 1), np.uint8))
        for pnum, (param, arg) in enumerate(zip(self.parameter_slots, args)):
            for ix, slot in param:
                value = arg
                for i in ix:
                    value = value[i]
                shape = slot.shape
                value = np.asarray(value)
                if value.dtype != shape.dtype.np_dtype:
                    value = value.astype(shape.dtype.np_dtype)
                phys = to_physical(value.reshape(shape.dims), shape.layout)
                if pnum in donated and np.shares_memory(phys, value) and value.flags.owndata:
                    phys.flags.writeable = True     # the caller gave this memory away
                elif pnum in donated:
                    phys = phys.copy()
                raw = phys.reshape(-1).view(np.uint8) if phys.size else np.zeros(1, np.uint8)
                if pnum not in donated:
                    raw.flags.writeable = False
                buffers[slot.allocation] = raw
        for k, b in enumerate(buffers):
            if b is None:   # a parameter allocation whose value is a zero-size array
                buffers[k] = np.zeros(max(a.allocations[k].size, 1), np.uint8)
        return Memory(buffers)  # type: ignore[arg-type]

    def run(self, args: list[Any], donated: frozenset[int] = frozenset(),
            ctx: Optional[EvalContext] = None) -> list[np.ndarray]:
        """Run on logical arrays (tuples for tuple parameters); flattened logical results.

        Parameters in ``donated`` (a subset of ``donated_parameters``) give their memory to
        the outputs aliased with them: the caller must not use those arrays afterwards.
        ``ctx``: the device's interpreter context (ids, collectives meeting other devices:
        ``hlo.evaluator.collectives.lockstep``); one device by default.
        """
        if len(args) != len(self.parameter_slots):
            raise InvalidArgumentError(f"{self.module.name} takes {len(self.parameter_slots)} "
                                       f"arguments, got {len(args)}")
        mem = self._memory(list(args), frozenset(donated) & frozenset(self.donated_parameters))
        ctx = ctx if ctx is not None else EvalContext(Evaluator())
        self.sequence.run(mem, self.slots, ctx)
        # Output allocations are fresh for every run (and a donated parameter's memory now
        # belongs to its output), so results are views of them: no copy. Token leaves of
        # the result are not returned (PJRT has no token buffers).
        return [mem.read(slot) for slot in self.output_slots]

    def profile(self, args: list[Any], reps: int = 3) -> list[tuple[str, float]]:
        """Wall time of each top-level thunk (ms, mean of ``reps`` runs of it alone after
        one run of the whole program), in ``CudaExecutable.profile``'s format. Thunks are
        re-run on whatever their operands hold, so only the times mean anything."""
        import time
        mem = self._memory(list(args), frozenset())
        ctx = EvalContext(Evaluator())
        self.sequence.run(mem, self.slots, ctx)
        out: list[tuple[str, float]] = []
        for t in self.sequence.thunks:
            t0 = time.perf_counter()
            for _ in range(reps):
                t.run(mem, self.slots, ctx)
            out.append((t.describe().strip().splitlines()[0], (time.perf_counter() - t0) * 1e3 / reps))
        return out

    def describe(self) -> str:
        """The thunk sequence, one line per thunk (nested sequences indented)."""
        return self.sequence.describe()


def has_token_results(module: Module) -> bool:
    return any(not s.is_array for _, s in leaf_paths(module.entry.root.shape))

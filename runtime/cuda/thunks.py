"""Thunks of the CUDA executable: each reads and writes device memory at the slots buffer
assignment gave its operands and results.

- ``KernelThunk``: a fusion's generated Triton kernel (``codegen.triton``); also a lone
  instruction the fusion pass left alone, wrapped into a one-instruction fusion;
- ``LibraryThunk``: a library call (``codegen.library``: cuBLAS GEMM for an unfused dot);
- ``CopyThunk`` (``Tensor.copy_``, layouts through strides), ``BytesCopyThunk`` (a bitcast
  whose result got its own buffer: the same bytes, copied);
- ``WhileThunk`` / ``ConditionalThunk``: host-driven: the predicate or branch index is read
  to the host, then the body or branch sequence runs (its own straight-line parts replayed
  as CUDA graphs);
- ``HostThunk``: what no kernel generator takes (sort, gather, custom calls, complex
  numbers ...): operands copied to the host, the interpreter's rule, result copied back.
  Correct, slow, and it cannot be captured in a graph: the executable counts them.

Capturable thunks (``capturable = True``) only launch device work on the current stream
(no host synchronization), so a run of them can be recorded as one CUDA graph.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from hlo.evaluator.core import TOKEN
from hlo.ir import Computation, Instruction
from passes.dataflow import reads_at_same_index  # the in-place rule lives in the analysis
from runtime.thunks import Slot

from .arena import Memory
from .errors import KernelCompileError

Index = tuple[int, ...]


class RunContext:
    """What a run needs besides memory: the interpreter context (host fallbacks) and the
    counters the executable reports."""

    def __init__(self, eval_ctx: Any, stats: dict[str, int]):
        self.eval_ctx = eval_ctx
        self.stats = stats


class Thunk:
    kind = "thunk"
    capturable = True

    def __init__(self, inst: Instruction):
        self.inst = inst

    def run(self, mem: Memory, ctx: RunContext) -> None:
        raise NotImplementedError

    def allocations(self) -> set[int]:
        """Allocation numbers this thunk reads or writes (graphs key on their addresses)."""
        return set()

    def label(self) -> str:
        return f"%{self.inst.name}"

    def describe(self, depth: int = 0) -> str:
        return "  " * depth + f"{self.kind} {self.label()}"

    def walk(self):
        yield self


class SlotThunk(Thunk):
    """A thunk over fixed operand and result slots (one slot per array leaf)."""

    def __init__(self, inst: Instruction, inputs: list[Slot], outputs: list[Slot]):
        super().__init__(inst)
        self.inputs, self.outputs = inputs, outputs

    def allocations(self) -> set[int]:
        return {s.allocation for s in self.inputs + self.outputs}


class KernelThunk(SlotThunk):
    """One Triton kernel launch over arena views."""
    kind = "kernel"

    def __init__(self, inst: Instruction, kernel: Any, inputs: list[Slot], outputs: list[Slot],
                 fusion: Instruction, wrapped: bool = False,
                 fallback: Optional["HostThunk"] = None):
        super().__init__(inst, inputs, outputs)
        self.kernel = kernel
        self.wrapped = wrapped          # a lone instruction made into a one-op fusion
        self.fallback = fallback        # where a wrapped op goes if Triton cannot compile it
        self.state = "new"              # new -> ok (compiled, launched once) | host
        # Outputs that share bytes with an input the kernel does not read strictly at the
        # output's own index (buffer assignment let the fusion write over a dying operand):
        # a parallel kernel could overwrite an element another program has yet to read, so
        # these go to a private scratch buffer and are copied over after the launch.
        single_pass = getattr(kernel, "template", None) == "loop"
        self.unsafe_outputs = [k for k, o in enumerate(outputs)
                               if any(overlaps(o, i) and not reads_at_same_index(
                                   fusion, j, k, single_pass) for j, i in enumerate(inputs))]
        self._scratch: dict[int, Any] = {}

    def _outs(self, mem: Memory) -> tuple[list, list]:
        outs = [mem.view(s) for s in self.outputs]
        if not self.unsafe_outputs:
            return outs, []
        pending = []
        for k in self.unsafe_outputs:
            buf = self._scratch.get(k)
            if buf is None:
                buf = self._scratch[k] = outs[k].new_empty(outs[k].shape).as_strided(
                    outs[k].shape, outs[k].stride())
            pending.append((outs[k], buf))
            outs[k] = buf
        return outs, pending

    def run(self, mem: Memory, ctx: RunContext) -> None:
        if self.state == "host":
            return self.fallback.run(mem, ctx)      # type: ignore[union-attr]
        outs, pending = self._outs(mem)
        ins = [mem.view(s) for s in self.inputs]
        if self.state == "ok":
            self.kernel.launch(outs, ins)
            for dst, src in pending:
                dst.copy_(src)
            return
        if getattr(self.kernel, "autotune", False):
            # Autotuning launches the kernel many times: an input it writes over in place
            # (buffer assignment's sharing) would be updated again on every launch.
            ins = [v.clone() if any(overlaps(s, o) for o in self.outputs) else v
                   for v, s in zip(ins, self.inputs)]
        try:
            self.kernel.launch(outs, ins)      # first launch: Triton compiles (and tunes)
        except Exception as e:  # noqa: BLE001
            if self.fallback is None:
                raise KernelCompileError(
                    f"Triton could not compile or launch kernel {self.kernel.name} for fusion "
                    f"%{self.inst.name}: {type(e).__name__}: {e}\n  generated source: "
                    f"{self.kernel.path}") from e
            # A one-op kernel the runtime made up itself: run the op on the host instead
            # (counted, and it no longer joins CUDA graphs).
            self.state, self.capturable = "host", False
            ctx.stats["kernel_compile_fallbacks"] = ctx.stats.get("kernel_compile_fallbacks", 0) + 1
            ctx.stats.setdefault("compile_fallback_names", []).append(
                f"%{self.inst.name}: {type(e).__name__}: {str(e)[:200]}")
            return self.fallback.run(mem, ctx)
        for dst, src in pending:
            dst.copy_(src)
        self.state = "ok"

    def label(self) -> str:
        tag = " (one-op)" if self.wrapped else ""
        made = ", CUDA C" if getattr(self.kernel, "emitter", "") == "cuda" else ""
        return f"%{self.inst.name} {self.kernel.name} [{self.kernel.template}{made}]{tag}"


class LibraryThunk(SlotThunk):
    """A library call (cuBLAS through torch) writing its output view in place."""
    kind = "library-call"

    def __init__(self, inst: Instruction, call: Callable, inputs: list[Slot], outputs: list[Slot]):
        super().__init__(inst, inputs, outputs)
        self.call = call
        # The output shares bytes with an operand (buffer assignment's in-place sharing of a
        # dying operand): a GEMM cannot write over its own input, so it writes a fresh tensor.
        # A call may name one operand it reads only at the index it writes (a GEMM's residual,
        # cuBLAS's C with beta = 1: ``in_place_operand``); that operand in exactly the output's
        # slot is updated in place, not copied out and back.
        k = getattr(call, "in_place_operand", None)
        self.aliased = any(overlaps(o, i) for o in outputs for j, i in enumerate(inputs)
                           if not (j == k and len(outputs) == 1 and i == o))

    def run(self, mem: Memory, ctx: RunContext) -> None:
        ins = [mem.view(s) for s in self.inputs]
        if len(self.outputs) > 1:   # a call with a tuple result (flash attention + stats)
            outs = [mem.view(s) for s in self.outputs]
            if self.aliased:
                for o, r in zip(outs, self.call(self.inst, ins)):
                    o.copy_(r)
            else:
                self.call(self.inst, ins, out=tuple(outs))
            return
        out = mem.view(self.outputs[0])
        if self.aliased:
            out.copy_(self.call(self.inst, ins))
        else:
            self.call(self.inst, ins, out=out)

    def label(self) -> str:
        plan = getattr(self.call, "plan", None)
        p = plan(self.inst) if plan is not None else None
        return (f"%{self.inst.name} {p.name if p is not None else getattr(self.call, '__name__', '')}"
                + getattr(self.call, "label_suffix", ""))


class CopyThunk(SlotThunk):
    """``copy``: each leaf copied with ``Tensor.copy_`` (a layout change is a strided copy)."""
    kind = "copy"

    def run(self, mem: Memory, ctx: RunContext) -> None:
        for src, dst in zip(self.inputs, self.outputs):
            same = (src.allocation, src.offset) == (dst.allocation, dst.offset)
            if src.shape.layout == dst.shape.layout:
                if not same:
                    copy_bytes(mem.raw(dst), mem.raw(src), ctx)
                continue
            v = mem.view(src)
            if overlaps(src, dst):      # a transpose in place: read everything first
                v = v.clone()
            mem.view(dst).copy_(v)


class BytesCopyThunk(SlotThunk):
    """A bitcast whose result has its own buffer: the operand's bytes, copied."""
    kind = "bytes-copy"

    def run(self, mem: Memory, ctx: RunContext) -> None:
        src, dst = self.inputs[0], self.outputs[0]
        n = min(src.nbytes, dst.nbytes)
        if n:
            copy_bytes(mem.raw(dst)[:n], mem.raw(src)[:n], ctx)


def copy_bytes(dst: Any, src: Any, ctx: RunContext) -> None:
    """``dst[:] = src`` for flat uint8 tensors: ``copy_`` (cudaMemcpy), or, where the run is
    captured for the native launcher (``ctx.kernel_copies``), an elementwise kernel: the
    driver refuses to re-point a captured memcpy node at XLA's memory, a kernel's
    parameters it re-points (runtime/cuda/native/patch.py)."""
    if not getattr(ctx, "kernel_copies", False):
        dst.copy_(src)
        return
    import torch
    n = src.numel()
    for dtype, width in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if n % width == 0 and src.data_ptr() % width == 0 and dst.data_ptr() % width == 0:
            src, dst = src.view(dtype), dst.view(dtype)
            break
    torch.bitwise_or(src, 0, out=dst)


class HostThunk(Thunk):
    """One instruction (or a whole fusion) run by the reference interpreter on the host."""
    kind = "host-fallback"
    capturable = False

    def __init__(self, inst: Instruction, operand_leaves: list[list[tuple[Index, Slot]]],
                 result_leaves: list[tuple[Index, Slot]], reason: str):
        super().__init__(inst)
        self.operand_leaves = operand_leaves
        self.result_leaves = result_leaves
        self.reason = reason

    def allocations(self) -> set[int]:
        out = {s.allocation for _, s in self.result_leaves}
        for leaves in self.operand_leaves:
            out |= {s.allocation for _, s in leaves}
        return out

    def run(self, mem: Memory, ctx: RunContext) -> None:
        inst = self.inst
        operands = [_assemble(o.shape, leaves, mem) for o, leaves in
                    zip(inst.operands, self.operand_leaves)]
        if inst.opcode == "fusion":
            value = ctx.eval_ctx.call(inst.attrs["calls"], operands)
        else:
            value = inst.op.evaluate(inst, operands, ctx.eval_ctx)
        ctx.stats["host_fallback_runs"] = ctx.stats.get("host_fallback_runs", 0) + 1
        for ix, slot in self.result_leaves:
            v = value
            for i in ix:
                v = v[i]
            mem.write_host(slot, v)

    def label(self) -> str:
        return f"%{self.inst.name} ({self.inst.opcode}: {self.reason})"


def _assemble(shape: Any, leaves: list[tuple[Index, Slot]], mem: Memory) -> Any:
    by_index = dict(leaves)

    def build(s: Any, prefix: Index) -> Any:
        if s.is_tuple:
            return tuple(build(e, prefix + (i,)) for i, e in enumerate(s.elements))
        if not s.is_array:
            return TOKEN
        return mem.read_host(by_index[prefix])
    return build(shape, ())


class SequenceThunk(Thunk):
    """Thunks run in order. Straight-line capturable runs are ``GraphSegment``s (graphs.py)."""
    kind = "sequence"
    capturable = False

    def __init__(self, inst: Optional[Instruction], thunks: list[Thunk]):
        self.inst = inst  # type: ignore[assignment]
        self.thunks = thunks

    def run(self, mem: Memory, ctx: RunContext) -> None:
        for t in self.thunks:
            t.run(mem, ctx)

    def describe(self, depth: int = 0) -> str:
        return "\n".join(t.describe(depth) for t in self.thunks)

    def walk(self):
        for t in self.thunks:
            yield from t.walk()


class WhileThunk(Thunk):
    """Host-driven loop: condition sequence, read the predicate, body sequence."""
    kind = "while"
    capturable = False

    def __init__(self, inst: Instruction, cond: SequenceThunk, body: SequenceThunk,
                 predicate: Slot):
        super().__init__(inst)
        self.cond, self.body, self.predicate = cond, body, predicate

    def run(self, mem: Memory, ctx: RunContext) -> None:
        while True:
            self.cond.run(mem, ctx)
            if not bool(mem.view(self.predicate).item()):   # synchronizes with the device
                break
            self.body.run(mem, ctx)
            ctx.stats["loop_iterations"] = ctx.stats.get("loop_iterations", 0) + 1

    def describe(self, depth: int = 0) -> str:
        pad = "  " * depth
        return (f"{pad}while %{self.inst.name} (host-driven)\n{pad} condition:\n"
                f"{self.cond.describe(depth + 1)}\n{pad} body:\n{self.body.describe(depth + 1)}")

    def walk(self):
        yield self
        yield from self.cond.walk()
        yield from self.body.walk()


class CountedLoopThunk(Thunk):
    """A ``while`` whose trip count is known (``hlo.trip_count``: lax.scan, fori_loop with
    static bounds): the body's thunks run that many times, the predicate never read back.
    Capturable when the body is: one CUDA graph then holds every iteration (an LSTM's
    scan of 128 steps ran 177 us of host work per step, host-driven)."""
    kind = "loop"

    def __init__(self, inst: Instruction, body: list[Thunk], trips: int):
        super().__init__(inst)
        self.body, self.trips = body, trips

    @property
    def capturable(self) -> bool:              # type: ignore[override]
        return all(t.capturable for t in self.body)

    def run(self, mem: Memory, ctx: RunContext) -> None:
        for _ in range(self.trips):
            for t in self.body:
                t.run(mem, ctx)
        ctx.stats["loop_iterations"] = ctx.stats.get("loop_iterations", 0) + self.trips

    def describe(self, depth: int = 0) -> str:
        pad = "  " * depth
        return (f"{pad}while %{self.inst.name} ({self.trips} trips, counted: no predicate "
                f"read)\n{pad} body:\n" + "\n".join(t.describe(depth + 1) for t in self.body))

    def walk(self):
        yield self
        for t in self.body:
            yield from t.walk()


class ConditionalThunk(Thunk):
    """Host-driven conditional: read the predicate / branch index, run that branch."""
    kind = "conditional"
    capturable = False

    def __init__(self, inst: Instruction, branches: list[SequenceThunk], indexed: bool,
                 selector: Slot):
        super().__init__(inst)
        self.branches, self.indexed, self.selector = branches, indexed, selector

    def run(self, mem: Memory, ctx: RunContext) -> None:
        sel = mem.view(self.selector).item()
        if not self.indexed:
            k = 0 if bool(sel) else 1      # {true, false}, as XLA orders them
        else:
            k = int(sel)
            if k < 0 or k >= len(self.branches):
                k = len(self.branches) - 1  # out of range: the last branch (XLA)
        self.branches[k].run(mem, ctx)

    def describe(self, depth: int = 0) -> str:
        pad = "  " * depth
        return f"{pad}conditional %{self.inst.name} (host-driven)\n" + "\n".join(
            f"{pad} branch {k}:\n{b.describe(depth + 1)}" for k, b in enumerate(self.branches))

    def walk(self):
        yield self
        for b in self.branches:
            yield from b.walk()


def overlaps(a: Slot, b: Slot) -> bool:
    """Whether two leaves share any byte."""
    return a.allocation == b.allocation and a.offset < b.offset + b.nbytes and \
        b.offset < a.offset + a.nbytes and a.nbytes > 0 and b.nbytes > 0


def one_instruction_fusion(inst: Instruction) -> Instruction:
    """``inst`` as a fusion of itself (one parameter per operand), for the Triton code
    generator. Nothing in the module changes: operands of the returned fusion are free
    standing placeholders."""
    body = Computation(f"wrapped_{inst.name}")
    params = [body.add_instruction(Instruction("parameter", [], o.shape, name=f"param_{k}",
                                               parameter_number=k))
              for k, o in enumerate(inst.operands)]
    clone = Instruction(inst.opcode, params, inst.shape, dict(inst.attrs), name=inst.name,
                        literal=inst.literal)
    body.root = body.add_instruction(clone)
    stand_ins = [Instruction("parameter", [], o.shape, name=o.name, parameter_number=k)
                 for k, o in enumerate(inst.operands)]
    kind = "kInput" if inst.opcode in ("reduce", "dot") else "kLoop"
    fusion = Instruction("fusion", stand_ins, inst.shape, {"kind": kind, "calls": body},
                         name=inst.name)
    body.fusion_instruction = fusion
    return fusion

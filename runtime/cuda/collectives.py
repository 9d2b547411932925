"""Collectives of a partitioned program, one process per GPU: NCCL through torch.distributed.

Every process runs the same per-device program (the SPMD partitioner's output) on its own
GPU; process ``rank`` is partition ``rank`` (one replica), so an instruction's
``replica_groups`` name ranks directly (``hlo.evaluator.collectives.device_groups``).

- all-reduce: the result buffer is reduced in place (``dist.all_reduce``) after copying the
  operand there; sum/product/max/min map to NCCL's ops (and/or on predicates to min/max);
- all-gather / reduce-scatter / all-to-all on dimension ``d``: the operand's chunks along
  ``d`` are made the leading dimension (one contiguous staging tensor), NCCL's flat
  ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` / ``all_to_all_single`` runs on it,
  and the result is put back along ``d``;
- collective-permute: point-to-point sends and receives in one batch (a device no pair
  targets gets zeros, as XLA);
- partition-id / replica-id: the rank, written by a fill.

Anything else grouped (a reducer NCCL has no op for, tuple all-to-all, collective-broadcast,
element types NCCL cannot reduce) takes the reference path: every member's operands are
gathered, copied to the host, and ``hlo.evaluator.collectives.combine`` computes this
member's result, so a rare form is slow, never wrong.

A combined (variadic) all-reduce is one NCCL call: its operands are packed into one
contiguous buffer of their element type, reduced, and unpacked.

Asynchronous pairs (``async-collective-creator``): the start issues the communication with
``async_op=True`` (NCCL runs on its own stream, after the work queued before it) and the
done waits for it (the compute stream waits; the host does not) and writes the result, so
kernels scheduled between the two overlap the transfer. ``async-start`` runs the
collective its computation wraps (reduce-scatter, all-to-all).

Process groups must be created by every rank in the same order: the executable is built in
the same instruction order on every rank, and each thunk creates the groups it needs while
it is built. torch orders a group's members by rank; XLA orders them as the replica group
lists them, so chunk orders are permuted where the two differ.

On NCCL the fast-path collectives and point-to-point permutes are capturable: they join
CUDA graph segments (``HLOTK_CAPTURE_COLLECTIVES=0``, or the executable option
``capture_collectives=False``, keeps them out), an asynchronous pair
only when everything between its start and its done is capturable too. The reference
path synchronizes with the host and always ends a segment.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from hlo.errors import HlotkError
from hlo.evaluator.collectives import combine, device_groups, permute_domain
from hlo.evaluator.reductions import simple_binary_reducer
from hlo.ir import Instruction
from runtime.thunks import Slot

from .arena import Memory, torch_dtype
from .thunks import RunContext, SlotThunk, Thunk

GROUPED = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-broadcast"}
COLLECTIVE_OPS = GROUPED | {"collective-permute", "partition-id", "replica-id"}
ASYNC_STARTS = {"all-reduce-start", "all-gather-start", "collective-permute-start",
                "async-start"}
ASYNC_DONES = {"all-reduce-done", "all-gather-done", "collective-permute-done", "async-done"}
ASYNC_COLLECTIVES = ASYNC_STARTS | ASYNC_DONES


class CollectiveError(HlotkError):
    """A collective this runtime cannot run across GPUs, or one that failed."""


@dataclass
class Communicator:
    """This process's place among the GPUs of a partitioned run, and its process groups.

    ``backend`` is torch.distributed's (``nccl`` on GPUs; ``gloo`` runs the same thunks on
    CPU tensors, for tests on a machine without GPUs)."""
    rank: int
    world: int
    backend: str = "nccl"
    _groups: dict[tuple, tuple[Any, list[int]]] = field(default_factory=dict, repr=False)

    @classmethod
    def current(cls) -> "Communicator":
        """The communicator of the initialized default process group."""
        import torch.distributed as dist
        if not dist.is_initialized():
            raise CollectiveError("torch.distributed is not initialized: a partitioned "
                                  "program runs on GPUs through runtime.cuda.distributed")
        return cls(dist.get_rank(), dist.get_world_size(), str(dist.get_backend()))

    def group(self, groups: list[list[int]]) -> tuple[Any, list[int]]:
        """(torch process group, member ranks in XLA's order) for this rank, creating the
        groups of ``groups`` on first use (collectively: every rank asks in the same order)."""
        key = tuple(tuple(g) for g in groups)
        hit = self._groups.get(key)
        if hit is not None:
            return hit
        import torch.distributed as dist
        mine: Optional[tuple[Any, list[int]]] = None
        for g in groups:
            if any(not 0 <= r < self.world for r in g):
                raise CollectiveError(f"replica group {list(g)} names a device outside the "
                                      f"{self.world} devices of this run")
            if sorted(g) == list(range(self.world)):
                pg = dist.group.WORLD
            elif len(g) == 1:
                pg = None                       # a group of one: no communication
            else:
                pg = dist.new_group(ranks=sorted(g))
            if self.rank in g:
                mine = (pg, list(g))
        if mine is None:
            raise CollectiveError(f"device {self.rank} is in no replica group of {groups}")
        self._groups[key] = mine
        return mine


_NCCL_OPS = {"add": "SUM", "multiply": "PRODUCT", "maximum": "MAX", "minimum": "MIN"}
_PRED_OPS = {"and": "MIN", "or": "MAX", "maximum": "MAX", "minimum": "MIN"}


def _reduce_op(inst: Instruction, dtype_name: str) -> Optional[Any]:
    """NCCL's op for the instruction's reducer on this element type, or None."""
    import torch.distributed as dist
    opcode = simple_binary_reducer(inst.attrs["to_apply"])
    if opcode is None:
        return None
    name = (_PRED_OPS if dtype_name == "pred" else _NCCL_OPS).get(opcode)
    if name is None or dtype_name in ("c64", "c128") and name != "SUM":
        return None
    return getattr(dist.ReduceOp, name)


def _chunked(x: Any, n: int, dim: int) -> Any:
    """``x`` split into ``n`` chunks along ``dim``, stacked as a new leading dim (contiguous)."""
    shape = list(x.shape)
    shape[dim:dim + 1] = [n, shape[dim] // n]
    return x.reshape(shape).movedim(dim, 0).contiguous()


def _unchunked(stacked: Any, dim: int) -> Any:
    """The inverse of ``_chunked``: the leading dim's chunks concatenated along ``dim``."""
    moved = stacked.movedim(0, dim)
    shape = list(moved.shape)
    shape[dim:dim + 2] = [shape[dim] * shape[dim + 1]]
    return moved.reshape(shape)


def _torch_order(members: list[int]) -> Optional[list[int]]:
    """For torch's member order (sorted ranks), the XLA position of each; None if equal."""
    ranked = sorted(members)
    return None if ranked == members else [members.index(r) for r in ranked]


def _xla_order(members: list[int]) -> Optional[list[int]]:
    """For XLA's member order, the torch (sorted) position of each; None if equal."""
    ranked = sorted(members)
    return None if ranked == members else [ranked.index(r) for r in members]


Completion = Callable[[], None]


class CollectiveThunk(SlotThunk):
    """One collective over the GPUs of the run (see the module docstring).

    ``issue`` starts the communication (torch.distributed with ``async_op=True``: NCCL runs
    on its own stream, ordered after the work already queued on the current stream) and
    returns the completion, which waits for it (the current stream waits: no host
    synchronization on NCCL) and writes the results. A synchronous collective completes
    at once; an asynchronous pair (``AsyncStartThunk`` / ``AsyncDoneThunk``) issues at
    the start and completes at the done, with other thunks between."""
    kind = "collective"

    def __init__(self, inst: Instruction, inputs: list[Slot], outputs: list[Slot],
                 comm: Communicator, op: Optional[Instruction] = None, capture: bool = True):
        super().__init__(inst, inputs, outputs)
        self.comm = comm
        self.op = op if op is not None else inst       # the instruction with the attributes
        opcode = self.opcode = _base(self.op.opcode)
        self.pg: Any = None
        self.members: list[int] = [comm.rank]
        self.alone = True        # every group has one member: nothing to communicate
        if opcode in GROUPED:
            groups = device_groups(self.op, 1, comm.world)
            self.pg, self.members = comm.group(groups)
            self.alone = all(len(g) == 1 for g in groups)
        self.dim = (self.op.attrs.get("dimensions") or (None,))[0]
        self.fast = self._fast_path()
        self._packed: dict[str, Any] = {}        # dtype -> the one buffer all operands share
        # NCCL supports stream capture of its collectives and point-to-point calls (torch's
        # ProcessGroupNCCL forks its stream off the capturing one and joins it at the wait).
        self.capturable = (comm.backend == "nccl" and capture and not (
            self.alone and opcode in GROUPED) and (self.fast or opcode in (
                "collective-permute", "partition-id", "replica-id")))

    def _fast_path(self) -> bool:
        op, n = self.opcode, len(self.members)
        if op not in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
            return False
        if any(torch_dtype(s.shape.dtype) is None for s in self.inputs + self.outputs):
            return False
        if op in ("all-reduce", "reduce-scatter") and any(
                _reduce_op(self.op, s.shape.dtype.name) is None for s in self.inputs):
            return False
        if op in ("all-gather", "reduce-scatter", "all-to-all"):
            if self.dim is None or len(self.inputs) != len(self.outputs):
                return False
            if op != "all-gather" and any(s.shape.dims[self.dim] % n for s in self.inputs):
                return False
        return True

    # --- running -------------------------------------------------------------------------
    def run(self, mem: Memory, ctx: RunContext) -> None:
        self.issue(mem, ctx)()

    def issue(self, mem: Memory, ctx: RunContext) -> Completion:
        op = self.opcode
        ctx.stats["collectives"] = ctx.stats.get("collectives", 0) + 1
        if op in ("partition-id", "replica-id"):
            mem.view(self.outputs[0]).fill_(self.comm.rank if op == "partition-id" else 0)
            return _done
        if op == "collective-permute":
            return self._permute(mem)
        if self.alone:
            self._alone(mem, ctx)
            return _done
        if self.fast:
            return getattr(self, "_" + op.replace("-", "_"))(mem, ctx)
        self._reference(mem, ctx)
        return _done

    def _flat(self, mem: Memory, slot: Slot) -> Any:
        """The slot's bytes as a flat tensor of its element type (predicates as uint8)."""
        import torch
        td = torch_dtype(slot.shape.dtype)
        return mem.raw(slot).view(torch.uint8 if td == torch.bool else td)

    def _all_reduce(self, mem: Memory, ctx: RunContext) -> Completion:
        """One NCCL call per element type: a combined (variadic) all-reduce packs its
        operands into one contiguous buffer, reduces it, and unpacks into the results."""
        import torch.distributed as dist
        by_dtype: dict[str, list[tuple[Slot, Slot]]] = {}
        for src, dst in zip(self.inputs, self.outputs):
            by_dtype.setdefault(dst.shape.dtype.name, []).append((src, dst))
        works, unpack = [], []
        for name, pairs in by_dtype.items():
            op = _reduce_op(self.op, name)
            if len(pairs) == 1:
                src, dst = pairs[0]
                if (src.allocation, src.offset) != (dst.allocation, dst.offset) or \
                        src.shape.layout != dst.shape.layout:
                    mem.view(dst).copy_(mem.view(src))
                works.append(dist.all_reduce(self._flat(mem, dst), op=op, group=self.pg,
                                             async_op=True))
                continue
            buf = self._pack_buffer(mem, name, pairs)
            offset = 0
            for src, dst in pairs:
                n = dst.shape.size
                if src.shape.layout != dst.shape.layout:     # bytes in the result's order
                    mem.view(dst).copy_(mem.view(src))
                    src = dst
                buf[offset:offset + n].copy_(self._flat(mem, src))
                unpack.append((buf, offset, dst))
                offset += n
            works.append(dist.all_reduce(buf, op=op, group=self.pg, async_op=True))
            ctx.stats["packed_all_reduce_operands"] = \
                ctx.stats.get("packed_all_reduce_operands", 0) + len(pairs)

        def complete() -> None:
            for w in works:
                w.wait()
            for buf, offset, dst in unpack:
                n = dst.shape.size
                self._flat(mem, dst).copy_(buf[offset:offset + n])
        return complete

    def _pack_buffer(self, mem: Memory, name: str, pairs: list[tuple[Slot, Slot]]) -> Any:
        """The persistent contiguous buffer of this all-reduce's operands of one type (a
        fixed address: the call can be captured in a CUDA graph)."""
        buf = self._packed.get(name)
        if buf is None:
            import torch
            flat = self._flat(mem, pairs[0][1])
            buf = self._packed[name] = torch.empty(sum(d.shape.size for _, d in pairs),
                                                   dtype=flat.dtype, device=flat.device)
        return buf

    def _all_gather(self, mem: Memory, ctx: RunContext) -> Completion:
        import torch
        import torch.distributed as dist
        n, order = len(self.members), _xla_order(self.members)
        works, staged = [], []
        for src, dst in zip(self.inputs, self.outputs):
            x = mem.view(src).contiguous()
            stacked = torch.empty((n, *x.shape), dtype=x.dtype, device=x.device)
            if self.comm.backend == "nccl":
                works.append(dist.all_gather_into_tensor(stacked, x, group=self.pg,
                                                         async_op=True))
            else:
                works.append(dist.all_gather(list(stacked.unbind(0)), x, group=self.pg,
                                             async_op=True))
            staged.append((stacked, dst))
        return self._completion(mem, works, staged, order, unchunk=True)

    def _completion(self, mem: Memory, works: list, staged: list[tuple[Any, Slot]],
                    order: Optional[list[int]] = None, unchunk: bool = False) -> Completion:
        """Wait for ``works``, then write each received buffer (its chunks put in XLA's
        member order, and back along the collective's dimension) to its result slot."""
        def complete() -> None:
            for w in works:
                w.wait()
            for buf, dst in staged:
                if order is not None:
                    buf = buf[order]
                mem.view(dst).copy_(_unchunked(buf, self.dim) if unchunk else buf)
        return complete

    def _reduce_scatter(self, mem: Memory, ctx: RunContext) -> Completion:
        import torch.distributed as dist
        n, order = len(self.members), _torch_order(self.members)
        works, staged = [], []
        for src, dst in zip(self.inputs, self.outputs):
            stacked = _chunked(mem.view(src), n, self.dim)
            if order is not None:
                stacked = stacked[order]
            op = _reduce_op(self.op, src.shape.dtype.name)
            if self.comm.backend == "nccl":
                out = stacked.new_empty(stacked.shape[1:])
                works.append(dist.reduce_scatter_tensor(out, stacked, op=op, group=self.pg,
                                                        async_op=True))
            else:        # gloo has no reduce-scatter
                works.append(dist.all_reduce(stacked, op=op, group=self.pg, async_op=True))
                out = stacked[sorted(self.members).index(self.comm.rank)]
            staged.append((out, dst))
        return self._completion(mem, works, staged)

    def _all_to_all(self, mem: Memory, ctx: RunContext) -> Completion:
        import torch.distributed as dist
        n = len(self.members)
        send_order, recv_order = _torch_order(self.members), _xla_order(self.members)
        works, staged = [], []
        for src, dst in zip(self.inputs, self.outputs):
            stacked = _chunked(mem.view(src), n, self.dim)
            if send_order is not None:
                stacked = stacked[send_order]
            got = stacked.new_empty(stacked.shape)
            works.append(dist.all_to_all_single(got, stacked, group=self.pg, async_op=True))
            staged.append((got, dst))
        return self._completion(mem, works, staged, recv_order, unchunk=True)

    def _permute(self, mem: Memory) -> Completion:
        import torch.distributed as dist
        domain, _ = permute_domain(self.op, self.comm.rank, 1, self.comm.world)
        me = domain.index(self.comm.rank)
        x = mem.view(self.inputs[0])
        out = mem.view(self.outputs[0])
        ops, recv, received = [], None, False
        for s, t in self.op.attrs.get("source_target_pairs", ()):
            if max(s, t) >= len(domain):
                raise CollectiveError(f"%{self.inst.name}: source_target_pairs names id "
                                      f"{max(s, t)} beyond the {len(domain)} devices")
            if s == me and t != me:
                ops.append(dist.P2POp(dist.isend, x.contiguous(), domain[t]))
            if t == me:
                received = True
                if s == me:
                    out.copy_(x)
                else:
                    recv = x.new_empty(x.shape)
                    ops.append(dist.P2POp(dist.irecv, recv, domain[s]))
        works = dist.batch_isend_irecv(ops) if ops else []

        def complete() -> None:
            for work in works:
                work.wait()
            if recv is not None:
                out.copy_(recv)
            elif not received:
                out.zero_()
        return complete

    def _alone(self, mem: Memory, ctx: RunContext) -> None:
        """A group of one: the operands are the results (a reduce-scatter / all-to-all of
        one member keeps everything)."""
        results = combine(self.op, 0, [[mem.read_host(s) for s in self.inputs]],
                          ctx.eval_ctx)
        for slot, value in zip(self.outputs, results):
            mem.write_host(slot, value)

    def _reference(self, mem: Memory, ctx: RunContext) -> None:
        """Every member's operands gathered to the host; the interpreter's semantics."""
        import torch.distributed as dist
        mine = [mem.read_host(s) for s in self.inputs]
        everyone: list[Any] = [None] * self.comm.world
        dist.all_gather_object(everyone, mine)   # over all ranks: groups are disjoint
        per_member = [everyone[r] for r in self.members]
        results = combine(self.op, self.members.index(self.comm.rank), per_member,
                          ctx.eval_ctx)
        for slot, value in zip(self.outputs, results):
            mem.write_host(slot, np.asarray(value))

    def label(self) -> str:
        how = self.comm.backend if self.fast or self.opcode == "collective-permute" \
            else "reference"
        return f"%{self.inst.name} ({self.inst.opcode}, {how}, group {self.members})"


def _done() -> None:
    return None


def _base(opcode: str) -> str:
    return opcode[:-len("-start")] if opcode.endswith("-start") else opcode


class AsyncStartThunk(Thunk):
    """An asynchronous collective's start: the communication is issued; its completion
    waits for the done."""
    kind = "collective"          # issued here (counted as the collective)

    def __init__(self, collective: CollectiveThunk):
        super().__init__(collective.inst)
        self.collective = collective
        self.capturable = collective.capturable
        self.pending: Optional[Completion] = None

    def allocations(self) -> set[int]:
        return self.collective.allocations()

    def run(self, mem: Memory, ctx: RunContext) -> None:
        if self.pending is not None:
            raise CollectiveError(f"%{self.inst.name} started twice without its done")
        self.pending = self.collective.issue(mem, ctx)

    def label(self) -> str:
        return self.collective.label()


class AsyncDoneThunk(Thunk):
    """Waits for its start's communication and writes the result."""
    kind = "collective-wait"

    def __init__(self, inst: Instruction, start: AsyncStartThunk):
        super().__init__(inst)
        self.start = start
        self.capturable = start.capturable

    def allocations(self) -> set[int]:
        return self.start.allocations()

    def run(self, mem: Memory, ctx: RunContext) -> None:
        complete, self.start.pending = self.start.pending, None
        if complete is None:
            raise CollectiveError(f"%{self.inst.name}: done without its start")
        complete()

    def label(self) -> str:
        return f"%{self.inst.name} (waits for %{self.start.inst.name})"


def collective_thunk(inst: Instruction, leaves: Any, comm: Communicator,
                     starts: dict[int, AsyncStartThunk], capture: bool = True) -> Thunk:
    """The thunk for a collective (or partition-id / replica-id) instruction, or for one
    half of an asynchronous pair; ``leaves(i)`` gives an instruction's {index: Slot};
    ``starts`` collects the start thunks their dones look up."""
    op = inst.opcode
    if op in ASYNC_DONES:
        start = starts.get(inst.operands[0].uid)
        if start is None:
            raise CollectiveError(f"%{inst.name}: its start %{inst.operands[0].name} is not "
                                  "in the same sequence")
        return AsyncDoneThunk(inst, start)
    ins = [s for o in inst.operands for s in leaves(o).values()]
    outs = [s for ix, s in leaves(inst).items()
            if op not in ASYNC_STARTS or op == "all-reduce-start" or ix[:1] == (1,)]
    if op in ASYNC_STARTS:
        wrapped = inst.attrs["calls"].root if op == "async-start" else None
        if wrapped is not None and wrapped.opcode not in GROUPED:
            raise CollectiveError(f"%{inst.name}: async-start of {wrapped.opcode} is not a "
                                  "collective this runtime runs")
        thunk = AsyncStartThunk(CollectiveThunk(inst, ins, outs, comm, op=wrapped,
                                                capture=capture))
        starts[inst.uid] = thunk
        return thunk
    return CollectiveThunk(inst, ins, outs, comm, capture=capture)


def pair_capturable(thunks: list[Thunk]) -> None:
    """An asynchronous pair joins a CUDA graph only when everything between its start and
    its done does too (one segment records both, the communication and the wait)."""
    pos = {id(t): k for k, t in enumerate(thunks)}
    for k, t in enumerate(thunks):
        if isinstance(t, AsyncDoneThunk) and id(t.start) in pos:
            between = thunks[pos[id(t.start)] + 1:k]
            ok = t.start.capturable and all(b.capturable for b in between)
            t.capturable = t.start.capturable = ok

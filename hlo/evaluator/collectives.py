"""Collectives on one device, and ``simulate``: N devices in lock-step threads.

On one device (``ctx.collective is None``) every group is {this device}: all-reduce,
all-gather, reduce-scatter, all-to-all and collective-broadcast return their operand, and
collective-permute returns the operand if the device sends to itself, zeros otherwise.
With ``ctx.collective`` set, each collective is handed to it (``simulate`` installs one).

Which devices form a group follows XLA's CollectiveOpGroupMode:
- no channel_id: cross-replica (groups list replica ids; partitions are independent);
- channel_id, use_global_device_ids=false: cross-replica-and-partition (groups list replica
  ids, and each group includes every partition of those replicas);
- channel_id, use_global_device_ids=true: flattened ids (groups list global device ids
  ``replica * num_partitions + partition``);
- channel_id on ops without use_global_device_ids (all-to-all, collective-permute,
  collective-broadcast): cross-partition (ids are partition ids within one replica).
An empty replica_groups means one group of all ids of that kind.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..errors import EvaluationError, HlotkError
from ..ir import Computation, Instruction, Module
from ..ops import rule
from .core import TOKEN, EvalContext, Evaluator, to_value
from .reductions import apply_elementwise, cast_wrapping, simple_binary_reducer, _ufunc_for, \
    _compute_dtype

_ASYNC_DONE = ("all-reduce-done", "all-gather-done", "collective-permute-done")
_HAS_GLOBAL_IDS = ("all-reduce", "all-reduce-start", "all-gather", "all-gather-start",
                   "reduce-scatter")


def _base_opcode(opcode: str) -> str:
    return opcode[:-len("-start")] if opcode.endswith("-start") else opcode


# ---------------------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------------------
def group_mode(inst: Instruction) -> str:
    """'cross_replica' | 'cross_partition' | 'cross_replica_and_partition' | 'flattened'."""
    has_channel = inst.attrs.get("channel_id") is not None
    global_ids = inst.attrs.get("use_global_device_ids")
    base = _base_opcode(inst.opcode)
    if not has_channel:
        if global_ids:
            raise EvaluationError(f"%{inst.name}: use_global_device_ids needs a channel_id")
        return "cross_replica"
    if base not in _HAS_GLOBAL_IDS:
        return "cross_partition"
    return "flattened" if global_ids else "cross_replica_and_partition"


def device_groups(inst: Instruction, num_replicas: int, num_partitions: int,
                  numerics: str = "xla_cpu") -> list[list[int]]:
    """Every group of global device ids (``replica * num_partitions + partition``), each in
    rank order, for a collective using replica_groups.

    ``numerics`` (EvalContext.numerics) picks the rank order of a cross-replica-and-partition
    group, where XLA and the spec disagree: XLA (GetParticipatingDevices) lists replica by
    replica, each with all its partitions; the StableHLO spec lists partition by partition.
    """
    mode = group_mode(inst)
    rg = inst.attrs.get("replica_groups")
    gid = lambda r, p: r * num_partitions + p  # noqa: E731
    if mode == "flattened":
        groups = rg.expand(num_replicas * num_partitions) if rg is not None else \
            [list(range(num_replicas * num_partitions))]
        return [list(g) for g in groups]
    if mode == "cross_partition":
        groups = rg.expand(num_partitions) if rg is not None else [list(range(num_partitions))]
        return [[gid(r, p) for p in g] for r in range(num_replicas) for g in groups]
    groups = rg.expand(num_replicas) if rg is not None else [list(range(num_replicas))]
    if mode == "cross_replica":
        return [[gid(r, p) for r in g] for p in range(num_partitions) for g in groups]
    # cross_replica_and_partition: one group per replica group, all partitions of each.
    if numerics == "spec":
        return [[gid(r, p) for p in range(num_partitions) for r in g] for g in groups]
    return [[gid(r, p) for r in g for p in range(num_partitions)] for g in groups]


def group_of(inst: Instruction, device: int, num_replicas: int, num_partitions: int,
             numerics: str = "xla_cpu") -> list[int]:
    for g in device_groups(inst, num_replicas, num_partitions, numerics):
        if device in g:
            return g
    raise EvaluationError(f"%{inst.name}: device {device} is in no replica group of "
                          f"{inst.attrs.get('replica_groups')}")


def _in_some_group(inst: Instruction, device: int, num_replicas: int,
                   num_partitions: int) -> bool:
    return any(device in g for g in device_groups(inst, num_replicas, num_partitions))


def permute_domain(inst: Instruction, device: int, num_replicas: int,
                   num_partitions: int) -> tuple[list[int], str]:
    """The devices a collective-permute/broadcast pairs ids among, and the id kind."""
    r, p = divmod(device, num_partitions)
    if inst.attrs.get("channel_id") is None:
        return [rr * num_partitions + p for rr in range(num_replicas)], "replica"
    return [r * num_partitions + pp for pp in range(num_partitions)], "partition"


# ---------------------------------------------------------------------------------------
# Semantics given every participant's value (shared by one device and the simulator)
# ---------------------------------------------------------------------------------------
def _reduce_values(comp: Computation, values: list[np.ndarray], ctx: EvalContext) -> np.ndarray:
    """Fold values in group order with the reducer (vectorised fast path when simple)."""
    opcode = simple_binary_reducer(comp)
    out_dtype = values[0].dtype
    if opcode is not None:
        cdt = _compute_dtype(out_dtype)
        uf = _ufunc_for(opcode, cdt)
        acc = values[0].astype(cdt)
        for v in values[1:]:
            acc = uf(acc, v.astype(cdt))
        return cast_wrapping(acc, out_dtype)
    acc = values[0]
    for v in values[1:]:
        acc = apply_elementwise(comp, [acc, v], ctx, [out_dtype])[0]
    return acc


def _split(x: np.ndarray, parts: int, dim: int, what: str) -> list[np.ndarray]:
    if x.shape[dim] % parts:
        raise EvaluationError(f"{what}: dimension {dim} of size {x.shape[dim]} does not split "
                              f"into {parts} parts")
    return np.split(x, parts, axis=dim)


def combine(inst: Instruction, rank: int, per_member: list[list[np.ndarray]],
            ctx: EvalContext) -> list[np.ndarray]:
    """This member's results of a grouped collective, given every member's operands
    (``per_member[i]`` are member i's operand arrays, in group rank order)."""
    base = _base_opcode(inst.opcode)
    n_ops = len(per_member[0])
    size = len(per_member)
    dim = (inst.attrs.get("dimensions") or (None,))[0]
    if base == "all-reduce":
        return [_reduce_values(inst.attrs["to_apply"], [m[i] for m in per_member], ctx)
                for i in range(n_ops)]
    if base == "all-gather":
        return [np.concatenate([m[i] for m in per_member], axis=dim) for i in range(n_ops)]
    if base == "reduce-scatter":
        out = []
        for i in range(n_ops):
            total = _reduce_values(inst.attrs["to_apply"], [m[i] for m in per_member], ctx)
            out.append(_split(total, size, dim, inst.opcode)[rank])
        return out
    if base == "all-to-all":
        if dim is None:           # tuple form: operand j goes to member j
            if n_ops != size:
                raise EvaluationError(f"all-to-all with {n_ops} operands needs a group of "
                                      f"{n_ops}, got {size}")
            return [per_member[j][rank] for j in range(size)]
        return [np.concatenate([_split(m[i], size, dim, inst.opcode)[rank] for m in per_member],
                               axis=dim) for i in range(n_ops)]
    if base == "collective-broadcast":
        return list(per_member[0])
    raise EvaluationError(f"{inst.opcode} is not a grouped collective")


def _operand_arrays(inst: Instruction, operands: list) -> list[np.ndarray]:
    return [o for o in operands if isinstance(o, np.ndarray)]


def _package(inst: Instruction, operands: list, results: list[np.ndarray]) -> Any:
    """Shape the results as the instruction's result shape (tuples, async start tuples)."""
    if inst.opcode in ("all-gather-start", "collective-permute-start") and inst.shape.is_tuple:
        # XLA's start ops return (operand(s), result(s), [contexts...]).
        first = operands[0] if len(operands) == 1 else tuple(operands)
        res = results[0] if len(results) == 1 else tuple(results)
        extra = [np.zeros(s.dims, s.dtype.np_dtype) for s in inst.shape.elements[2:]]
        return (first, res, *extra)
    if inst.shape.is_tuple:
        return tuple(results)
    return results[0]


def _zeros_like_result(inst: Instruction, x: np.ndarray) -> np.ndarray:
    return np.zeros(x.shape, x.dtype)


def _single_device(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    base = _base_opcode(inst.opcode)
    device = ctx.replica_id * ctx.num_partitions + ctx.partition_id
    arrays = _operand_arrays(inst, operands)
    if base == "collective-permute":
        pairs = inst.attrs.get("source_target_pairs", ())
        _, kind = permute_domain(inst, device, ctx.num_replicas, ctx.num_partitions)
        me = ctx.replica_id if kind == "replica" else ctx.partition_id
        x = arrays[0]
        out = x.copy() if (me, me) in [tuple(p) for p in pairs] else _zeros_like_result(inst, x)
        return _package(inst, operands, [out])
    if base == "collective-broadcast" and not _in_some_group(inst, device, ctx.num_replicas,
                                                              ctx.num_partitions):
        return _package(inst, operands, [np.zeros_like(a) for a in arrays])
    group = group_of(inst, device, ctx.num_replicas, ctx.num_partitions, ctx.numerics)
    if len(group) != 1:
        raise EvaluationError(f"%{inst.name}: a group of {len(group)} devices needs a "
                              "multi-device run (hlo.evaluator.collectives.simulate)")
    return _package(inst, operands, combine(inst, 0, [arrays], ctx))


@rule("evaluate", "all-reduce", "all-gather", "reduce-scatter", "all-to-all",
      "collective-permute", "collective-broadcast", "all-reduce-start", "all-gather-start",
      "collective-permute-start")
def _collective(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    if ctx.collective is not None:
        return ctx.collective(inst, operands)
    return _single_device(inst, operands, ctx)


@rule("evaluate", *_ASYNC_DONE)
def _collective_done(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    """The start op already holds the result: plain for all-reduce-start, element 1 of the
    (operand, result, ...) tuple for all-gather-start and collective-permute-start."""
    v = operands[0]
    if isinstance(v, tuple) and not inst.shape.is_tuple:
        return v[1]
    if isinstance(v, tuple) and inst.shape.is_tuple and len(v) > len(inst.shape.elements):
        return v[1]
    return v


# ---------------------------------------------------------------------------------------
# The multi-device simulator
# ---------------------------------------------------------------------------------------
class _Aborted(HlotkError):
    pass


@dataclass
class _Slot:
    values: dict[int, list] = field(default_factory=dict)
    readers: int = 0


class _Rendezvous:
    """Meeting points keyed by (instruction, execution count, participants)."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.cond = threading.Condition()
        self.slots: dict[tuple, _Slot] = {}
        self.failed: Optional[str] = None

    def exchange(self, key: tuple, participants: Sequence[int], device: int, value: list,
                 inst: Instruction) -> dict[int, list]:
        with self.cond:
            slot = self.slots.setdefault(key, _Slot())
            slot.values[device] = value
            self.cond.notify_all()
            ok = self.cond.wait_for(lambda: self.failed is not None
                                    or len(slot.values) == len(participants), self.timeout)
            if self.failed is not None:
                raise _Aborted(self.failed)
            if not ok:
                missing = sorted(set(participants) - set(slot.values))
                msg = (f"collective %{inst.name} ({inst.opcode}) timed out after "
                       f"{self.timeout:g}s on device {device}: devices {missing} never reached "
                       "it (they finished, failed, or took another branch)")
                self.fail(msg, locked=True)
                raise EvaluationError(msg)
            result = dict(slot.values)
            slot.readers += 1
            if slot.readers == len(participants):
                del self.slots[key]
            return result

    def fail(self, message: str, locked: bool = False) -> None:
        if locked:
            if self.failed is None:
                self.failed = message
            self.cond.notify_all()
            return
        with self.cond:
            self.fail(message, locked=True)


class _DeviceCollectives:
    """The ``ctx.collective`` callback of one simulated device."""

    def __init__(self, rv: _Rendezvous, device: int, num_replicas: int, num_partitions: int):
        self.rv = rv
        self.device = device
        self.R = num_replicas
        self.P = num_partitions
        self.counts: dict[int, int] = {}
        self.ctx: Optional[EvalContext] = None
        self.host: Optional["HostQueues"] = None   # infeed/outfeed/send/recv (simulate_programs)

    def exchange_group(self, inst: Instruction, group: Sequence[int],
                       arrays: list) -> dict[int, list]:
        """Meet the other members of ``group`` at ``inst``; every member's ``arrays`` by
        device id (for collectives evaluated outside ``__call__``, e.g. custom-calls)."""
        seq = self.counts.get(id(inst), 0)
        self.counts[id(inst)] = seq + 1
        return self.rv.exchange((id(inst), seq, tuple(group)), group, self.device, arrays, inst)

    def __call__(self, inst: Instruction, operands: list) -> Any:
        assert self.ctx is not None
        seq = self.counts.get(id(inst), 0)
        self.counts[id(inst)] = seq + 1
        base = _base_opcode(inst.opcode)
        arrays = _operand_arrays(inst, operands)
        if base == "collective-permute":
            domain, kind = permute_domain(inst, self.device, self.R, self.P)
            got = self.rv.exchange((id(inst), seq, tuple(domain)), domain, self.device,
                                   arrays, inst)
            # Pair ids are replica (or partition) numbers: id i is device domain[i].
            me = domain.index(self.device)
            out = _zeros_like_result(inst, arrays[0])
            for src, dst in inst.attrs.get("source_target_pairs", ()):
                if src >= len(domain) or dst >= len(domain):
                    raise EvaluationError(f"%{inst.name}: source_target_pairs names id "
                                          f"{max(src, dst)} beyond {len(domain)} {kind}s")
                if dst == me:
                    out = got[domain[src]][0].copy()
            return _package(inst, operands, [out])
        if base == "collective-broadcast" and not _in_some_group(inst, self.device, self.R,
                                                                  self.P):
            # The spec: a process outside every group gets zeros.
            return _package(inst, operands, [np.zeros_like(a) for a in arrays])
        group = group_of(inst, self.device, self.R, self.P, self.ctx.numerics)
        got = self.rv.exchange((id(inst), seq, tuple(group)), group, self.device, arrays, inst)
        per_member = [got[d] for d in group]
        return _package(inst, operands,
                        combine(inst, group.index(self.device), per_member, self.ctx))


def simulate(module: Module, per_device_args: Sequence[Sequence[Any]], num_replicas: int,
             num_partitions: int = 1, timeout: float = 30.0, **ctx_options: Any) -> list[Any]:
    """Run ``module`` on ``num_replicas * num_partitions`` simulated devices in lock-step.

    ``per_device_args[d]`` are the arguments of device ``d = replica * num_partitions +
    partition``; returns each device's result in the same order. Each device runs in its
    own thread with its own Evaluator; collectives meet at a barrier. A device that never
    reaches a collective its peers wait in makes them raise EvaluationError after
    ``timeout`` seconds instead of hanging; an error on any device is re-raised.
    ``ctx_options`` are further EvalContext fields (e.g. ``numerics="spec"``).
    """
    n = num_replicas * num_partitions
    if module.entry is None:
        raise EvaluationError("module has no entry computation")
    results, _ = simulate_programs([module.entry] * n, per_device_args, num_replicas,
                                   num_partitions, timeout=timeout, **ctx_options)
    return results


def simulate_programs(programs: Sequence[Module | Computation],
                      per_device_args: Sequence[Sequence[Any]], num_replicas: int,
                      num_partitions: int = 1, timeout: float = 30.0,
                      infeed: Sequence[Any] = (), **ctx_options: Any
                      ) -> tuple[list[Any], list[tuple[int, Any]]]:
    """``simulate`` with a program per device (``programs[d]``, a Module's entry or a
    Computation), a shared infeed queue and the host transfers recorded.

    Devices running the same Computation object meet in its collectives; devices running
    different programs talk through send/recv (channels are FIFO queues keyed by
    channel_id). ``infeed`` entries are popped in order by whichever device's infeed runs
    first (each entry: an array, or a tuple of arrays for a tuple-shaped infeed). Returns
    (each device's result, the outfeed record as (device, value) pairs in arrival order).
    ``ctx_options`` are further EvalContext fields (e.g. ``numerics``).
    """
    n = num_replicas * num_partitions
    if len(per_device_args) != n or len(programs) != n:
        raise EvaluationError(f"simulate: {n} devices need {n} programs and argument lists, "
                              f"got {len(programs)} and {len(per_device_args)}")
    comps = [p.entry if isinstance(p, Module) else p for p in programs]
    if any(c is None for c in comps):
        raise EvaluationError("module has no entry computation")
    host = HostQueues(infeed, timeout)

    def run(d: int, ctx: EvalContext) -> Any:
        comp = comps[d]
        args = per_device_args[d]
        if len(args) != len(comp.parameters):
            raise EvaluationError(f"device {d}: %{comp.name} takes "
                                  f"{len(comp.parameters)} arguments, got {len(args)}")
        conv = [to_value(a, prm.shape) for a, prm in zip(args, comp.parameters)]
        return ctx.evaluator.run_computation(comp, conv, ctx)
    results = lockstep(run, num_replicas, num_partitions, timeout, host=host, **ctx_options)
    return results, list(host.outfeed)


def lockstep(run: Callable[[int, EvalContext], Any], num_replicas: int, num_partitions: int = 1,
             timeout: float = 30.0, host: Optional["HostQueues"] = None,
             **ctx_options: Any) -> list[Any]:
    """``run(d, ctx)`` for every device d in its own thread, ``ctx`` an EvalContext whose
    collectives meet the other devices' (the shared machinery of ``simulate`` and of the
    CPU executable run on several devices). Returns each device's result; the first real
    error (not a peer aborted because of it) is raised in the caller's thread."""
    n = num_replicas * num_partitions
    rv = _Rendezvous(timeout)
    results: list[Any] = [None] * n
    errors: list[Optional[BaseException]] = [None] * n

    def one(d: int) -> None:
        r, p = divmod(d, num_partitions)
        cb = _DeviceCollectives(rv, d, num_replicas, num_partitions)
        cb.host = host
        ctx = EvalContext(Evaluator(), replica_id=r, partition_id=p, num_replicas=num_replicas,
                          num_partitions=num_partitions, collective=cb, **ctx_options)
        cb.ctx = ctx
        try:
            results[d] = run(d, ctx)
        except BaseException as e:   # noqa: BLE001 - re-raised in the caller's thread
            errors[d] = e
            rv.fail(f"device {d} failed: {e}")
            if host is not None:
                host.fail(f"device {d} failed: {e}")

    threads = [threading.Thread(target=one, args=(d,), name=f"hlotk-device-{d}", daemon=True)
               for d in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Report the root cause, not the peers that were aborted because of it.
    real = [e for e in errors if e is not None and not isinstance(e, _Aborted)
            and "_Aborted" not in type(e.__cause__).__name__]
    if real:
        raise real[0]
    aborted = [e for e in errors if e is not None]
    if aborted:
        raise EvaluationError(str(aborted[0]))
    return results


# ---------------------------------------------------------------------------------------
# Host transfers and send/recv between simulated devices
# ---------------------------------------------------------------------------------------
class HostQueues:
    """What simulated devices share besides collectives: the infeed queue, the outfeed
    record and one FIFO queue per send/recv channel."""

    def __init__(self, infeed: Sequence[Any] = (), timeout: float = 30.0):
        self.timeout = timeout
        self.cond = threading.Condition()
        self.infeed: deque = deque(infeed)
        self.outfeed: list[tuple[int, Any]] = []
        self.channels: dict[int, deque] = {}
        self.failed: Optional[str] = None

    def fail(self, message: str) -> None:
        with self.cond:
            if self.failed is None:
                self.failed = message
            self.cond.notify_all()

    def pop_infeed(self, inst: Instruction) -> Any:
        with self.cond:
            if not self.infeed:
                raise EvaluationError(f"%{inst.name}: infeed queue is empty")
            return self.infeed.popleft()

    def push_outfeed(self, device: int, value: Any) -> None:
        with self.cond:
            self.outfeed.append((device, value))

    def send(self, channel: int, value: Any) -> None:
        with self.cond:
            self.channels.setdefault(channel, deque()).append(value)
            self.cond.notify_all()

    def recv(self, channel: int, device: int, inst: Instruction) -> Any:
        with self.cond:
            q = self.channels.setdefault(channel, deque())
            ok = self.cond.wait_for(lambda: self.failed is not None or q, self.timeout)
            if q:
                return q.popleft()
            if self.failed is not None:
                raise _Aborted(self.failed)
            assert not ok
            raise EvaluationError(f"%{inst.name} (recv) on device {device} timed out after "
                                  f"{self.timeout:g}s: nothing was sent on channel {channel}")


def _host(inst: Instruction, ctx: EvalContext) -> "HostQueues":
    host = getattr(ctx.collective, "host", None)
    if host is None:
        raise EvaluationError(f"%{inst.name}: {inst.opcode} needs a host; run it with "
                              "hlo.evaluator.collectives.simulate_programs")
    return host


def _device(ctx: EvalContext) -> int:
    return ctx.replica_id * ctx.num_partitions + ctx.partition_id


@rule("evaluate", "infeed")
def _infeed(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    data_shape = inst.shape.elements[0]
    entry = _host(inst, ctx).pop_infeed(inst)
    if data_shape.is_tuple and not isinstance(entry, (tuple, list)):
        entry = (entry,)
    return (to_value(entry, data_shape), TOKEN)


@rule("evaluate", "outfeed")
def _outfeed(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    _host(inst, ctx).push_outfeed(_device(ctx), operands[0])
    return TOKEN


def _channel(inst: Instruction) -> int:
    ch = inst.attrs.get("channel_id")
    if ch is None:
        raise EvaluationError(f"%{inst.name}: {inst.opcode} needs a channel_id")
    return int(ch)


@rule("evaluate", "send")
def _send(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    _host(inst, ctx).send(_channel(inst), operands[0])
    return (operands[0], np.zeros((), np.uint32), TOKEN)


@rule("evaluate", "recv")
def _recv(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    value = _host(inst, ctx).recv(_channel(inst), _device(ctx), inst)
    return (to_value(value, inst.shape.elements[0]), np.zeros((), np.uint32), TOKEN)


@rule("evaluate", "send-done")
def _send_done(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    return TOKEN


@rule("evaluate", "recv-done")
def _recv_done(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    return (operands[0][0], TOKEN)


# ---------------------------------------------------------------------------------------
# Collectives newer than JAX's StableHLO, carried as custom-calls
# ---------------------------------------------------------------------------------------
# ``stablehlo.collective_reduce`` and ``stablehlo.collective_broadcast`` with
# ``has_dynamic_root`` do not exist in the StableHLO JAX ships, so a front end rewrites them
# into ``custom-call``s with these targets (runtime/conformance.py does). backend_config is
# an MLIR dictionary: ``{replica_groups = [[0, 1]], channel_id = 0, has_dynamic_root =
# true}``; collective_reduce's reducer is ``called_computations[0]``. Groups follow the
# spec: cross_replica(replica_groups) without a channel, cross_partition(replica_groups)
# with channel_id > 0. With a dynamic root the last operand is an s32[N] of group ranks,
# one per data operand; otherwise every root is rank 0. A process in no group gets zeros.
NEWER_COLLECTIVE_TARGETS = ("stablehlo.collective_broadcast", "stablehlo.collective_reduce")


def _newer_collective(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    from ..attrs import ReplicaGroups
    from .custom_calls import parse_mlir_dict
    target = inst.attrs.get("custom_call_target")
    cfg = parse_mlir_dict(inst.attrs.get("backend_config"))
    dynamic = bool(cfg.get("has_dynamic_root", False))
    arrays = [np.asarray(o) for o in operands]
    data = arrays[:-1] if dynamic else arrays
    if not data:
        raise EvaluationError(f"%{inst.name} ({target}): no data operands")
    roots = [int(r) for r in arrays[-1].reshape(-1)] if dynamic else [0] * len(data)
    if len(roots) != len(data):
        raise EvaluationError(f"%{inst.name} ({target}): {len(roots)} roots for "
                              f"{len(data)} data operands")
    attrs: dict = {"replica_groups": ReplicaGroups(tuple(
        tuple(int(i) for i in g) for g in cfg.get("replica_groups", ())))}
    if int(cfg.get("channel_id", 0)) > 0:
        attrs["channel_id"] = int(cfg["channel_id"])
    # collective-broadcast has the group modes the spec gives these ops (no global ids).
    proxy = Instruction("collective-broadcast", [], inst.shape, attrs)
    device = ctx.replica_id * ctx.num_partitions + ctx.partition_id
    group = next((g for g in device_groups(proxy, ctx.num_replicas, ctx.num_partitions)
                  if device in g), None)
    zeros = [np.zeros_like(d) for d in data]
    if group is None:
        results = zeros
    else:
        for r in roots:
            if not 0 <= r < len(group):
                raise EvaluationError(f"%{inst.name} ({target}): root {r} outside the group "
                                      f"{group}")
        if ctx.collective is None:
            if len(group) != 1:
                raise EvaluationError(f"%{inst.name}: a group of {len(group)} devices needs a "
                                      "multi-device run (hlo.evaluator.collectives.simulate)")
            per_member = [data]
        else:
            exchange = getattr(ctx.collective, "exchange_group", None)
            if exchange is None:
                raise EvaluationError(f"%{inst.name} ({target}): this multi-device runner "
                                      "cannot exchange values for custom-call collectives")
            got = exchange(inst, group, data)
            per_member = [got[d] for d in group]
        rank = group.index(device)
        if target == "stablehlo.collective_broadcast":
            results = [per_member[roots[j]][j].copy() for j in range(len(data))]
        else:
            comps = inst.attrs.get("called_computations") or ()
            if not comps:
                raise EvaluationError(f"%{inst.name}: collective_reduce needs its reducer in "
                                      "called_computations")
            results = [_reduce_values(comps[0], [m[j] for m in per_member], ctx)
                       if rank == roots[j] else zeros[j] for j in range(len(data))]
    return tuple(results) if inst.shape.is_tuple else results[0]


def _register_newer_collectives() -> None:
    from .custom_calls import register
    register(*NEWER_COLLECTIVE_TARGETS)(_newer_collective)


_register_newer_collectives()

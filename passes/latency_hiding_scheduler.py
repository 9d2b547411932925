"""``latency-hiding-scheduler``: order a computation so that collectives overlap compute.

After ``async-collective-creator`` every collective is a start/done pair. This scheduler
(XLA's LatencyHidingScheduler, simplified to a top-down list scheduler on a simulated
clock) issues a start as soon as its operands are ready and delays its done until the
collective is predicted to have finished, filling the gap with instructions that do not
depend on it:

- **cost model**: an instruction costs what the fusion cost model predicts on the target
  (``passes/fusion/cost_model.predict``: bytes over HBM bandwidth, flops over the rate,
  launch overhead); a collective costs ``collective_latency_us + bytes moved per device /
  link_bandwidth_gbps`` from the same device spec, with ring algorithms' bytes: an
  all-reduce moves 2 (p-1)/p of its buffer, an all-gather / reduce-scatter / all-to-all
  (p-1)/p of the larger side, a collective-permute all of it;
- **priority**: the longest predicted path from an instruction to the end of the
  computation (a start's edge to its done weighs the collective's time), so the work the
  collective's consumers wait for is not starved;
- **rules**, at each step, first that applies: a free instruction (parameter, constant,
  tuple, view); a done whose collective has finished (it
  frees its slot and costs nothing); a start, while fewer than ``overlap_limit``
  collectives of its kind are in flight (XLA:GPU's default is one); the ready compute
  instruction of highest priority; otherwise the done that finishes first (the clock waits
  for it).

Memory is not modelled: overlapping keeps a collective's buffers alive longer (XLA's
scheduler also tracks a memory limit; here the default ``schedule`` pass keeps its
lowest-peak order for computations without collectives). The ``schedule`` pass uses this
order for every computation that has asynchronous collectives.
"""
from __future__ import annotations

from dataclasses import dataclass

from hlo.ir import Computation, Instruction, Module

from .async_collectives import ASYNC_DONES, ASYNC_STARTS, sequential_computations, \
    wrapped_opcode
from .base import register_pass


_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "partition-id",
         "replica-id", "after-all"}


def _group_size(start: Instruction, num_devices: int) -> int:
    if start.opcode == "async-start":
        start = start.attrs["calls"].root
    if start.opcode.startswith("collective-permute"):
        return 2
    rg = start.attrs.get("replica_groups")
    groups = rg.expand(num_devices) if rg is not None else []
    groups = [g for g in groups if g]
    return len(groups[0]) if groups else num_devices


def collective_time_us(start: Instruction, spec, num_devices: int) -> float:
    """Predicted time of the collective ``start`` begins (see the module docstring)."""
    from .fusion.cost_model import array_bytes
    op = wrapped_opcode(start)
    p = max(_group_size(start, num_devices), 1)
    operand = sum(array_bytes(o.shape) for o in start.operands)
    if start.opcode == "all-reduce-start":
        result = array_bytes(start.shape)
    else:
        result = array_bytes(start.shape.elements[1])
    if op == "all-reduce":
        moved = 2 * (p - 1) / p * result
    elif op == "collective-permute":
        moved = operand
    else:
        moved = (p - 1) / p * max(operand, result)
    bandwidth = spec.link_bandwidth_gbps * 1e3 or spec.bytes_per_us   # bytes per us
    return spec.collective_latency_us + moved / bandwidth


def compute_time_us(inst: Instruction, spec) -> float:
    if inst.opcode in ASYNC_STARTS or inst.opcode in ASYNC_DONES:
        return 0.0
    from .fusion.cost_model import predict
    try:
        return predict(inst, spec).time_us
    except Exception:  # noqa: BLE001  (an op the cost model has no rule for: count it free)
        return 0.0


def has_async_collectives(comp: Computation) -> bool:
    return any(i.opcode in ASYNC_STARTS for i in comp.instructions)


@dataclass
class ScheduleReport:
    """What the scheduler predicted: per start, the collective's time and the compute it
    put between the start and the done."""
    overlaps: dict[str, tuple[float, float]]      # start name -> (collective us, overlapped us)
    makespan_us: float


def latency_hiding_schedule(comp: Computation, target: str = "h100", num_devices: int = 2,
                            overlap_limit: int = 1
                            ) -> tuple[list[Instruction], ScheduleReport]:
    """The order of ``comp``'s instructions (operands and control predecessors first)."""
    from .fusion.cost_model import get_device
    spec = get_device(target)
    insts = comp.instructions
    preds = {i.uid: list(dict.fromkeys(i.operands + i.control_predecessors)) for i in insts}
    succs: dict[int, list[Instruction]] = {i.uid: [] for i in insts}
    for i in insts:
        for p in preds[i.uid]:
            succs[p.uid].append(i)
    cost = {i.uid: compute_time_us(i, spec) for i in insts}
    coll = {i.uid: collective_time_us(i, spec, num_devices)
            for i in insts if i.opcode in ASYNC_STARTS}

    # Longest path to the end (a start -> done edge weighs the collective).
    level: dict[int, float] = {}
    for i in reversed(comp.post_order()):
        edge = coll.get(i.uid, 0.0)
        level[i.uid] = cost[i.uid] + max((level[s.uid] + (edge if s.opcode in ASYNC_DONES
                                                           else 0.0)
                                          for s in succs[i.uid]), default=0.0)
    position = {i.uid: k for k, i in enumerate(insts)}
    waiting = {i.uid: len(preds[i.uid]) for i in insts}
    ready = [i for i in insts if waiting[i.uid] == 0]
    clock = 0.0
    finish: dict[int, float] = {}          # start uid -> when its collective ends
    in_flight: dict[str, int] = {}
    started_at: dict[int, float] = {}
    order: list[Instruction] = []
    overlaps: dict[str, tuple[float, float]] = {}

    def key(i: Instruction) -> tuple[float, int]:
        return (-level[i.uid], position[i.uid])

    while ready:
        free = [i for i in ready if i.opcode in _FREE]
        if free:                       # leaves and views: no time, no reason to wait
            pick = min(free, key=lambda i: position[i.uid])
            ready.remove(pick)
            order.append(pick)
            for s in succs[pick.uid]:
                waiting[s.uid] -= 1
                if waiting[s.uid] == 0:
                    ready.append(s)
            continue
        dones = [d for d in ready if d.opcode in ASYNC_DONES]
        finished = [d for d in dones if finish[d.operands[0].uid] <= clock]
        starts = [s for s in ready if s.opcode in ASYNC_STARTS
                  and in_flight.get(wrapped_opcode(s), 0) < overlap_limit]
        compute = [c for c in ready if c.opcode not in ASYNC_DONES
                   and c.opcode not in ASYNC_STARTS]
        if finished:
            pick = min(finished, key=key)
        elif starts:
            pick = min(starts, key=key)
        elif compute:
            pick = min(compute, key=key)
        elif dones:     # nothing else to do: wait for the first collective to finish
            pick = min(dones, key=lambda d: (finish[d.operands[0].uid], key(d)))
        else:           # only starts over the limit whose dones wait on something else
            pick = min(ready, key=key)
        ready.remove(pick)
        order.append(pick)
        if pick.opcode in ASYNC_STARTS:
            kind = wrapped_opcode(pick)
            in_flight[kind] = in_flight.get(kind, 0) + 1
            finish[pick.uid] = clock + coll[pick.uid]
            started_at[pick.uid] = clock
        elif pick.opcode in ASYNC_DONES:
            start = pick.operands[0]
            kind = wrapped_opcode(start)
            in_flight[kind] -= 1
            hidden = min(clock - started_at[start.uid], coll[start.uid])
            overlaps[start.name] = (coll[start.uid], hidden)
            clock = max(clock, finish[start.uid])
        else:
            clock += cost[pick.uid]
        for s in succs[pick.uid]:
            waiting[s.uid] -= 1
            if waiting[s.uid] == 0:
                ready.append(s)
    assert len(order) == len(insts), "a cycle in the computation"
    return order, ScheduleReport(overlaps, clock)


@register_pass
@dataclass(frozen=True)
class LatencyHidingScheduler:
    """Order every computation with asynchronous collectives by the latency-hiding
    schedule (the others keep their order); marks the module scheduled."""
    name = "latency-hiding-scheduler"
    target: str = "h100"
    overlap_limit: int = 1

    def run(self, module: Module) -> bool:
        changed = False
        n = int(module.config.get("num_partitions", 1) or 1) * \
            int(module.config.get("replica_count", 1) or 1)
        for comp in sequential_computations(module):
            if not has_async_collectives(comp):
                continue
            order, _ = latency_hiding_schedule(comp, self.target, n, self.overlap_limit)
            if [i.uid for i in order] != [i.uid for i in comp.instructions]:
                comp.instructions[:] = order
                changed = True
        return changed


def predicted_overlap(comp: Computation, target: str = "h100", num_devices: int = 2
                      ) -> ScheduleReport:
    """Simulate ``comp``'s current order on the cost model: per start, the collective's
    predicted time and how much of it compute scheduled before its done hides."""
    from .fusion.cost_model import get_device
    spec = get_device(target)
    clock = 0.0
    started: dict[int, tuple[float, float]] = {}
    overlaps: dict[str, tuple[float, float]] = {}
    for inst in comp.instructions:
        if inst.opcode in ASYNC_STARTS:
            started[inst.uid] = (clock, collective_time_us(inst, spec, num_devices))
        elif inst.opcode in ASYNC_DONES:
            start = inst.operands[0]
            t0, t = started[start.uid]
            overlaps[start.name] = (t, min(clock - t0, t))
            clock = max(clock, t0 + t)
        else:
            clock += compute_time_us(inst, spec)
    return ScheduleReport(overlaps, clock)

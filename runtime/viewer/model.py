"""What the viewer page shows, as plain JSON-able data built from modules.

A ``ViewerData`` holds *snapshots* (one module each: every computation's instructions with
their HLO line, shape, bytes, source location, fusion decisions, predicted and measured
µs), *pairs* of snapshots shown side by side (a pass's before/after, or XLA beside
hlotk) with added/removed/changed marks and the links that keep one selection on both
sides, and an optional *memory* timeline (the buffer assignment of a scheduled snapshot).
``runtime.viewer.page`` turns it into one self-contained HTML file.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from hlo.graph import array_bytes, source_location
from hlo.ir import Instruction, Module
from hlo.render import CATEGORY_COLORS, FUSION_COLOR, category

# Colour of each op category (the drawing's palette); nodes carry an index into it.
CATEGORIES = list(CATEGORY_COLORS.items()) + [("fusion", FUSION_COLOR)]
_CATEGORY_INDEX = {name: k for k, (name, _) in enumerate(CATEGORIES)}

# Instructions that launch nothing: no predicted time.
_NO_KERNEL = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast"})


@dataclass
class Pair:
    """Two snapshots side by side. ``marks_*``: instruction name -> added/removed/changed.
    ``groups_*``: instruction name -> group id; a selection on one side selects the
    instructions of the same group on the other (default: the same name)."""
    label: str
    left: int
    right: int
    marks_left: dict[str, str] = field(default_factory=dict)
    marks_right: dict[str, str] = field(default_factory=dict)
    groups_left: dict[str, int] = field(default_factory=dict)
    groups_right: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: Optional[float] = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"label": self.label, "left": self.left, "right": self.right,
                               "marksL": self.marks_left, "marksR": self.marks_right}
        if self.groups_left or self.groups_right:
            out["groupsL"], out["groupsR"] = self.groups_left, self.groups_right
        if self.notes:
            out["notes"] = self.notes
        if self.seconds is not None:
            out["ms"] = round(self.seconds * 1e3, 3)
        return out


@dataclass
class ViewerData:
    title: str = "hlotk viewer"
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)
    memory: Optional[dict[str, Any]] = None
    notes: list[str] = field(default_factory=list)

    def add_module(self, module: Module, label: str, *, report: Any = None,
                   target: Optional[str] = None,
                   profile_us: Optional[Mapping[str, float]] = None,
                   origin_names: Optional[set[str]] = None) -> int:
        """Add a snapshot of ``module`` (serialized now); returns its index.

        ``report``: a ``FusionReport`` whose names refer to the unfused module (default:
        the one attached to ``module``); ``target``: device spec for predicted µs (default:
        the report's; no prediction without either); ``profile_us``: measured µs by
        instruction name; ``origin_names``: instruction names of the unfused module, to
        map a fusion body's cloned names back (default: the report's edges)."""
        if report is None:
            from passes.fusion.explain import report_for
            report = report_for(module)
        if target is None and report is not None:
            target = report.target
        self.snapshots.append(module_json(module, label, report=report, target=target,
                                          profile_us=profile_us or {},
                                          origin_names=origin_names))
        return len(self.snapshots) - 1

    def add_pair(self, pair: Pair) -> int:
        self.pairs.append(pair)
        return len(self.pairs) - 1

    def set_memory(self, snapshot: int, assignment: Any) -> None:
        self.memory = memory_json(snapshot, assignment)

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "snapshots": self.snapshots, "categories": CATEGORIES,
                "pairs": [p.to_json() for p in self.pairs], "memory": self.memory,
                "notes": self.notes}


def diff_pair(label: str, left: int, right: int, diff: Any, seconds: Optional[float] = None) -> Pair:
    """A before/after pair from an ``hlo.diff.ModuleDiff``."""
    marks_l = {n: "removed" for n in diff.removed} | {n: "changed" for n in diff.changed}
    marks_r = {n: "added" for n in diff.added} | {n: "changed" for n in diff.changed}
    return Pair(label, left, right, marks_l, marks_r, notes=[diff.summary()], seconds=seconds)


# --- one module --------------------------------------------------------------------------
def module_json(module: Module, label: str, *, report: Any = None, target: Optional[str] = None,
                profile_us: Mapping[str, float] = {},
                origin_names: Optional[set[str]] = None) -> dict[str, Any]:
    comps = module.reachable_computations() or list(module.computations)
    index = {id(c): k for k, c in enumerate(comps)}
    fusion_info = _FusionInfo(report, origin_names) if report is not None else None
    spec = None
    if target is not None:
        from passes.fusion.cost_model import get_device
        spec = get_device(target)
    bodies = {id(i.attrs["calls"]) for c in comps for i in c.instructions if i.opcode == "fusion"}
    out_comps = []
    for comp in comps:
        pos = {id(i): k for k, i in enumerate(comp.instructions)}
        kernel_spec = None if id(comp) in bodies else spec
        out_comps.append({"name": comp.name, "nodes": [
            _node_json(inst, pos, index, fusion_info, kernel_spec, profile_us)
            for inst in comp.instructions]})
    return {"label": label, "name": module.name, "entry": index[id(module.entry)],
            "comps": out_comps, "target": target, "scheduled": module.is_scheduled,
            "kernels": _kernel_count(module), "instructions": sum(len(c.instructions) for c in comps)}


def _kernel_count(module: Module) -> int:
    from passes.fusion.cost_model import count_kernels
    return count_kernels(module)


def _node_json(inst: Instruction, pos: dict[int, int], index: dict[int, int],
               fusion_info: Optional["_FusionInfo"], spec: Any,
               profile_us: Mapping[str, float]) -> dict[str, Any]:
    """One instruction; ``spec``: device for predicted µs (None inside fusion bodies)."""
    node: dict[str, Any] = {
        "n": inst.name, "op": inst.opcode, "sh": inst.shape.to_text(), "b": array_bytes(inst.shape),
        "k": _CATEGORY_INDEX["fusion" if inst.opcode == "fusion" else category(inst)],
        "in": [pos[id(o)] for o in inst.operands if id(o) in pos],
        "t": inst.to_text().strip(),
    }
    calls = [index[id(c)] for c in inst.called_computations if id(c) in index]
    if calls:
        node["c"] = calls
    if inst.is_root:
        node["root"] = 1
    md = inst.metadata
    if md.get("op_name"):
        node["on"] = md.get("op_name")
    src = source_location(inst)
    if src:
        node["src"] = src
    if inst.opcode == "fusion":
        node["fk"] = inst.attrs.get("kind", "")
        if fusion_info is not None:
            node["fd"] = fusion_info.decisions_for(inst)
    elif inst.opcode == "custom-call":
        node["fk"] = str(inst.attrs.get("custom_call_target", ""))
    if spec is not None and inst.opcode not in _NO_KERNEL:
        from passes.fusion.cost_model import predict
        est = predict(inst, spec)
        if est.kernels:
            node["pred"] = round(est.time_us, 3)
            node["mb"] = est.bytes_moved
    if inst.name in profile_us:
        node["us"] = round(float(profile_us[inst.name]), 3)
    return node


_CLONE_SUFFIX = re.compile(r"\.\d+$")


class _FusionInfo:
    """Fusion decisions per fusion instruction: edges of the unfused graph inside the
    fusion (why they fused) and across its boundary (why not)."""

    def __init__(self, report: Any, origin_names: Optional[set[str]]):
        self.edges = report.final_edges()
        self.names = origin_names or {n for d in self.edges for n in (d.producer, d.consumer)}
        self.report = report

    def origin(self, name: str) -> str:
        while name not in self.names and _CLONE_SUFFIX.search(name):
            name = _CLONE_SUFFIX.sub("", name)
        return name

    def decisions_for(self, fusion: Instruction) -> dict[str, Any]:
        body = fusion.attrs["calls"]
        members = {self.origin(i.name) for i in body.instructions if i.opcode != "parameter"}
        inside, boundary = [], []
        for d in self.edges:
            p_in, c_in = d.producer in members, d.consumer in members
            row = [d.producer, d.consumer, d.action, d.reason, round(d.unfused_us, 3),
                   round(d.fused_us, 3)]
            if p_in and c_in:
                inside.append(row)
            elif (p_in or c_in) and not d.fused and d.action != "none":
                boundary.append(row)
        return {"policy": self.report.policy, "target": self.report.target,
                "fused": inside, "apart": boundary}


# --- memory ------------------------------------------------------------------------------
def memory_json(snapshot: int, assignment: Any) -> dict[str, Any]:
    """The temp arena over the schedule: one rectangle per buffer (steps x offsets)."""
    seq = assignment.liveness.sequence
    buffers = []
    for b in assignment.buffers:
        if b.kind != "temp" or b.size == 0:
            continue
        producer = _producer(b)
        buffers.append([b.name, producer, b.size, b.offset, b.interval.start, b.interval.end])
    step, peak, at = assignment.peak()
    return {"snapshot": snapshot, "steps": [i.name for i in seq], "live": assignment.timeline(),
            "buffers": buffers, "arena": assignment.temp_size, "lower": assignment.lower_bound,
            "peak": [step, peak, [b.name for b in at[:8]]]}


def _producer(buffer: Any) -> str:
    for s in buffer.sets:
        for inst, _ in s.defining():
            return inst.name
    return buffer.sets[0].positions[0][0].name


def profile_by_name(profile: Any) -> dict[str, float]:
    """Measured µs by instruction name from a ``{name: µs}`` mapping, or from the
    ``[(thunk description, ms), ...]`` list that ``CudaExecutable.profile`` returns
    (descriptions name the instruction as ``%name``)."""
    if isinstance(profile, Mapping):
        return {str(k).lstrip("%"): float(v) for k, v in profile.items()}
    out: dict[str, float] = {}
    for desc, ms in profile:
        m = re.search(r"%([^\s(]+)", str(desc))
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(ms) * 1e3
    return out

"""A timeline of one step of a partitioned program: compute and communication, per lane.

The GPU workers record a step with ``torch.profiler`` (``GpuMesh.trace``) and export a
Chrome trace; ``events_from_trace`` reads it back as ``Event``s: device kernels by CUDA
stream on GPUs (NCCL's kernels run on their own stream), host ops by thread on the gloo
path. ``overlap`` measures how much communication time has compute running beside it,
and ``render`` draws the lanes as text, one character per time bucket:

    stream 7   compute |####  ######   #######|
    stream 21  comm    |   =========          |

so a step where the collectives hide behind the kernels shows ``=`` under ``#``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

_COMM = re.compile(r"nccl|gloo|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|"
                   r"sendrecv|send|recv|broadcast|c10d", re.I)


@dataclass(frozen=True)
class Event:
    lane: str          # "stream 7" (GPU) or "thread 1234" (host)
    name: str
    start_us: float
    dur_us: float
    kind: str          # "comm" or "compute"

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


def classify(name: str) -> str:
    return "comm" if _COMM.search(name) else "compute"


def events_from_trace(trace: dict | str, device: bool = True) -> list[Event]:
    """Events of a Chrome trace (a dict, or the path of its JSON): with ``device``, the GPU
    kernels and memory copies when there are any; else (or without any) the host ops."""
    if isinstance(trace, str):
        with open(trace) as f:
            trace = json.load(f)
    raw = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if device and gpu:
        return sorted((Event(f"stream {e.get('args', {}).get('stream', e.get('tid'))}",
                             e["name"], float(e["ts"]), float(e["dur"]), classify(e["name"]))
                       for e in gpu), key=lambda e: e.start_us)
    host = [e for e in raw if e.get("cat") in ("cpu_op", "user_annotation")
            and not e["name"].startswith("ProfilerStep")]
    return sorted((Event(f"thread {e.get('tid')}", e["name"], float(e["ts"]), float(e["dur"]),
                         classify(e["name"])) for e in host), key=lambda e: e.start_us)


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def overlap(events: Sequence[Event]) -> dict[str, float]:
    """Communication time, compute time and the communication time during which compute
    also ran (µs, unions of intervals: nested or concurrent events count once)."""
    comm = _union((e.start_us, e.end_us) for e in events if e.kind == "comm")
    comp = _union((e.start_us, e.end_us) for e in events if e.kind == "compute")
    both = 0.0
    j = 0
    for a, b in comm:
        while j < len(comp) and comp[j][1] <= a:
            j += 1
        k = j
        while k < len(comp) and comp[k][0] < b:
            both += max(0.0, min(b, comp[k][1]) - max(a, comp[k][0]))
            k += 1
    span = (max(e.end_us for e in events) - min(e.start_us for e in events)) if events else 0.0
    return {"comm_us": sum(b - a for a, b in comm), "compute_us": sum(b - a for a, b in comp),
            "overlapped_us": both, "span_us": span}


def render(events: Sequence[Event], width: int = 96) -> str:
    """The lanes as text: ``#`` compute, ``=`` communication, one column per time bucket."""
    if not events:
        return "(no events)"
    t0 = min(e.start_us for e in events)
    t1 = max(e.end_us for e in events)
    scale = max(t1 - t0, 1e-9) / width
    lanes: dict[str, list[str]] = {}
    kinds: dict[str, set[str]] = {}
    for e in events:
        row = lanes.setdefault(e.lane, [" "] * width)
        kinds.setdefault(e.lane, set()).add(e.kind)
        a = min(int((e.start_us - t0) / scale), width - 1)
        b = max(a + 1, min(int((e.end_us - t0) / scale + 0.999), width))
        mark = "=" if e.kind == "comm" else "#"
        for i in range(a, b):
            if row[i] == " " or mark == "=":
                row[i] = mark
    name_w = max(len(k) for k in lanes)
    lines = [f"{'':{name_w}}          0 µs{'':{max(width - 14, 1)}}{t1 - t0:8.1f} µs"]
    for lane in sorted(lanes, key=lambda k: ("comm" in kinds[k], k)):
        what = "comm" if kinds[lane] == {"comm"} else ("compute" if kinds[lane] == {"compute"}
                                                      else "mixed")
        lines.append(f"{lane:{name_w}}  {what:7} |{''.join(lanes[lane])}|")
    return "\n".join(lines)

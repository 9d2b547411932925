"""Library calls run once, on scratch outputs, while the first call waits for its Triton
compiles (issue 13, benchmarks/NOTES.md "i13-resnet-cold").

A cuDNN convolution's first call in a process pays cuDNN's start-up (its libraries loaded, a
handle made, the heuristics' models read) and, per convolution shape, the heuristics' query
and an execution plan built; a cuBLAS GEMM's first call pays its handle and cuBLASLt's
start-up; and each library kernel is loaded into the CUDA context at its first launch. On a
cold first call these came one after another, after the compile pool had finished. The
CUDA backend's first run hands the pool every Triton job and then, instead of only waiting
for the answers, runs each library call that says it is ``pure`` (it writes nothing but its
``out``) once on the arena's operand views and a scratch output (``warm``), so that the
real calls find their handles, plans and kernels ready.

This runs on the thread that launches the program afterwards, not in a background thread:
torch keeps cuDNN's execution plans per thread (a thread-local cache in ATen's cuDNN
convolutions), so a plan built elsewhere would not be found. Operands are read where they
lie, so the plan's key (sizes, strides, alignment) is the real call's; outputs are fresh
tensors with the output view's strides, never the arena (an output may share bytes with an
operand a thunk before it still reads). Calls whose scratch output would exceed
``MAX_OUTPUT_BYTES`` are left to their launch. Failures are left to the launch too, which
reports them. ``HLOTK_WARM_LIBRARIES=0`` turns this off.
"""
from __future__ import annotations

import os
import time
from typing import Any, Iterable

# A scratch output larger than this is not made (the warm-up's memory stays in torch's
# caching allocator for the process): such a call is left to its first launch.
MAX_OUTPUT_BYTES = 64 << 20


def enabled() -> bool:
    """``HLOTK_WARM_LIBRARIES`` (default on)."""
    return os.environ.get("HLOTK_WARM_LIBRARIES", "1").strip().lower() not in (
        "0", "off", "false", "no")


def warmable(thunk: Any) -> bool:
    """A library-call thunk with one output whose call writes only its ``out``."""
    call = getattr(thunk, "call", None)
    return getattr(thunk, "kind", "") == "library-call" and \
        bool(getattr(call, "pure", False)) and len(getattr(thunk, "outputs", ())) == 1


def warm(thunks: Iterable[Any], mem: Any) -> dict[str, Any]:
    """Run each ``warmable`` thunk's call once on ``mem``'s operand views and a scratch
    output; returns what it did: ``calls`` run, ``skipped`` (too large), ``failed``, and
    ``s`` (wall seconds, including the calls' host-side set-up; their device work is only
    queued)."""
    from .backend import scratch_like
    stats: dict[str, Any] = {"calls": 0, "skipped": 0, "failed": 0, "s": 0.0}
    t0 = time.perf_counter()
    for t in thunks:
        if not warmable(t):
            continue
        out_slot = t.outputs[0]
        if out_slot.shape.byte_size > MAX_OUTPUT_BYTES:
            stats["skipped"] += 1
            continue
        try:
            ins = [mem.view(s) for s in t.inputs]
            t.call(t.inst, ins, out=scratch_like(mem.view(out_slot)))
            stats["calls"] += 1
        except Exception:  # noqa: BLE001  (the launch runs it again and reports what fails)
            stats["failed"] += 1
    stats["s"] = time.perf_counter() - t0
    return stats

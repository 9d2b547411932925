"""Programmatic dependent launch (PDL, sm_90+) for generated kernels (issue 14).

A kernel launched with the programmatic-stream-serialization attribute may start before
the kernel ahead of it in the stream has finished: once every program of that kernel has
executed ``griddepcontrol.launch_dependents`` (or exited). Its programs then block in
``griddepcontrol.wait`` until the kernel ahead has completed and its writes are visible.
Captured into a CUDA graph, such a launch becomes a programmatic edge, so a graph replay
overlaps the second kernel's launch and ramp-up with the first kernel's tail.

Roles of a generated kernel (``Pdl``):

- ``wait``: ``gdc_wait()`` is the first statement of the kernel, before any load of
  anything an earlier kernel wrote, and the launch carries the attribute (Triton's
  ``launch_pdl`` compile option; ``direct_launch`` and Triton's launcher both set it from
  the compiled kernel's metadata). A kernel launched this way without the wait would read
  its inputs while they are being written: the wait is emitted exactly when the attribute
  is set.
- ``signal``: ``gdc_launch_dependents()`` follows (at the top as well: a program issues it
  once it runs, so the next kernel launches when the last program of this one has started,
  and no program of this kernel is left waiting for an SM the next one holds). Harmless
  when the next kernel is launched normally.

``HLOTK_PDL`` picks which kernels get roles: ``off`` (none, the default), ``split`` (a
split reduction's partials kernel signals, its finishing kernel waits: the pair from
``runtime/cuda/backend.py``), ``all`` (every generated kernel waits and signals). Nothing
is emitted under Triton's interpreter (it has no grid dependency control) or where the
installed Triton has no ``gdc_wait``.

Measured on the H200 (graph replays, benchmarks/NOTES.md, i14-pdl), hence off by default:
``split`` made transformer_train's split LN gradients slower, not faster (80 MiB pair 37.7
-> 41.1 us, 32 MiB 23.1 -> 26.9; the captured graph did hold the programmatic edge and the
results were bitwise those of a synced run); ``all`` took adam_step's 16 loop kernels from
0.194 to 0.184 ms of device time (-5%) but mlp_train from 1.122 to 1.131 ms (+0.8%).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from .elemental import TritonCodegenError

ENV = "HLOTK_PDL"
MODES = ("off", "split", "all")
DEFAULT = "off"
# Where the generated source imports the two builtins from (Triton >= 3.4; 3.6 and 3.9
# checked: ``triton/language/extra/cuda/gdc.py``).
IMPORT = "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait"


@dataclass(frozen=True)
class Pdl:
    """A generated kernel's part in programmatic dependent launch."""
    wait: bool = False       # gdc_wait() first, and launched with the PDL attribute
    signal: bool = False     # gdc_launch_dependents() at the top

    def __bool__(self) -> bool:
        return self.wait or self.signal


NONE = Pdl()


def mode() -> str:
    """``HLOTK_PDL``: off | split | all (the default: ``DEFAULT``); TritonCodegenError for
    anything else."""
    raw = (os.environ.get(ENV) or DEFAULT).strip().lower()
    if raw not in MODES:
        raise TritonCodegenError(f"{ENV}={os.environ.get(ENV)!r}: expected one of "
                                 f"{', '.join(MODES)}")
    return raw


_WHY_NOT: Optional[str] = None


def unavailable() -> str:
    """Why no kernel of this process gets PDL ("" where they can)."""
    global _WHY_NOT
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "Triton's interpreter has no grid dependency control"
    if _WHY_NOT is None:
        try:
            from triton.language.extra import cuda as tl_cuda
            ok = hasattr(tl_cuda, "gdc_wait") and hasattr(tl_cuda, "gdc_launch_dependents")
            _WHY_NOT = "" if ok else "this Triton has no gdc_wait / gdc_launch_dependents"
        except ImportError as e:
            _WHY_NOT = f"no triton.language.extra.cuda ({e})"
    return _WHY_NOT


def role(kind: str) -> Pdl:
    """The roles ``HLOTK_PDL`` gives a kernel of ``kind``: "kernel" (any generated kernel),
    "split_partials" or "split_finish" (the two kernels of a split reduction)."""
    if kind not in ("kernel", "split_partials", "split_finish"):
        raise TritonCodegenError(f"unknown PDL kernel kind {kind!r}")
    m = mode()
    if m == "off" or unavailable():
        return NONE
    if m == "all":
        return Pdl(wait=True, signal=True)
    if kind == "split_partials":
        return Pdl(signal=True)
    if kind == "split_finish":
        return Pdl(wait=True)
    return NONE


def prologue(pdl: Pdl) -> list[str]:
    """The kernel body's first lines for ``pdl`` (indented one level)."""
    out = []
    if pdl.wait:
        out.append("    gdc_wait()  # PDL: launched early; nothing an earlier kernel wrote is "
                   "read before this")
    if pdl.signal:
        out.append("    gdc_launch_dependents()  # PDL: the next kernel may launch now "
                   "(it waits for this one to finish)")
    return out


__all__ = ["Pdl", "NONE", "ENV", "MODES", "mode", "role", "prologue", "unavailable", "IMPORT"]

"""CUDA C kernels for loop fusions, compiled in process with NVRTC (issue 13).

A loop fusion's Triton kernel costs 0.12-0.18 s to compile (Triton's ir, ttgir, llir, ptx
and cubin stages); the same kernel in CUDA C through NVRTC 0.02-0.07 s (H200,
benchmarks/nvrtc_probe.py). The CUDA backend makes a loop fusion's kernel here when
``takes(loop_emitter(), predicted µs, flat)``: by default (``auto``) the small ones and the
purely elementwise (flat) ones, with ``HLOTK_LOOP_EMITTER=cuda`` every one:

- ``emitter``: the fusion -> one CUDA C ``__global__`` function, one thread per output
  element (``CudaCDeclined`` for what it does not take: that fusion keeps Triton);
- ``flat``: the form of purely elementwise fusions: the element count an argument (one
  source for every size), 16-byte vector loads and stores;
- ``prelude``: the C helpers (bf16/f16 by bit manipulation, NaN-propagating max/min);
- ``nvrtc``: libnvrtc through ctypes, background compiles, the on-disk cubin cache;
- ``kernel``: ``CudaCKernel`` (loaded and launched through the CUDA driver on torch's
  stream, the interface the backend's thunks use of a Triton kernel);
- ``host``: the same source compiled by the host C++ compiler and run on numpy arrays
  (tests, debugging: the kernel's interpret mode).
"""
from __future__ import annotations

import os

from .emitter import (CudaCDeclined, CudaCodegenError, KernelSource, decline_reason,  # noqa: F401
                      emit_loop_kernel)

ENV = "HLOTK_LOOP_EMITTER"
EMITTERS = ("auto", "triton", "cuda")
# ``auto``: CUDA C for loop kernels the cost model predicts under this many µs, Triton for
# the rest. Measured on the H200 (NOTES session 7): NVRTC compiles a loop kernel 3-8x
# faster than Triton (0.02-0.07 s against 0.12-0.18, on the cold first call's critical
# path), while the CUDA C kernels ran 8% slower on bandwidth-bound Adam updates (CUPTI, 229.6
# against 212.5 µs per step) and level with Triton on GIOU (8-9 µs). Under 5 µs a kernel is
# mostly launch and tail, and 8% of it is under half a microsecond per call.
AUTO_MAX_US = 5.0
# ``auto`` also takes every loop fusion with a flat form (flat.py) at any size. On the H200
# an Adam step's CUDA graph, replayed with L2 flushed on the call's own arguments, took
# 0.2037 ms with the flat CUDA C kernels against 0.2201 with Triton's (NOTES session 9,
# final call A; ``chunk`` 0.1978, ``approx`` 0.1974). Session 8's 0.242 against 0.221 ran
# on zeroed staging buffers, where every IEEE division and square root takes its slow path
# and Triton's approximate ones have none (i13-flat-sass). So the flat kernels cost no
# device time, and the cold first call loses its Triton compile (0.16-0.19 s), which put
# adam_step's under XLA's compile. ``HLOTK_LOOP_EMITTER=triton`` takes Triton's kernels.
AUTO_FLAT_ANY_SIZE = True


def loop_emitter() -> str:
    """``HLOTK_LOOP_EMITTER``: ``auto`` (default: CUDA C for loop kernels predicted under
    ``AUTO_MAX_US``, Triton for larger ones), ``cuda`` (CUDA C through NVRTC for every loop
    fusion it takes) or ``triton`` (Triton for every kernel). Fusions the CUDA C emitter
    declines, and every kernel where NVRTC cannot be loaded, keep Triton."""
    v = os.environ.get(ENV, "").strip().lower() or "auto"
    if v not in EMITTERS:
        raise CudaCodegenError(f"{ENV}={os.environ.get(ENV)!r}: expected one of "
                               f"{', '.join(EMITTERS)}")
    return v


def takes(emitter: str, predicted_us: float, flat: bool = False) -> bool:
    """Whether a loop fusion predicted at ``predicted_us`` goes to the CUDA C emitter under
    ``emitter`` (``loop_emitter()``'s value); ``flat``: the fusion has a flat form
    (``flat.flat_reason`` is "")."""
    return emitter == "cuda" or (emitter == "auto" and (
        predicted_us < AUTO_MAX_US or (flat and AUTO_FLAT_ANY_SIZE)))

"""CUDA C kernels for loop fusions, compiled in process with NVRTC (issue 13).

A loop fusion's Triton kernel costs 0.12-0.18 s to compile (Triton's ir, ttgir, llir, ptx
and cubin stages); the same kernel in CUDA C through NVRTC 0.02-0.05 s (H200,
benchmarks/nvrtc_probe.py). With ``HLOTK_LOOP_EMITTER=cuda`` the CUDA backend makes each
loop fusion's kernel here:

- ``emitter``: the fusion -> one CUDA C ``__global__`` function, one thread per output
  element (``CudaCDeclined`` for what it does not take: that fusion keeps Triton);
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
EMITTERS = ("triton", "cuda")


def loop_emitter() -> str:
    """``HLOTK_LOOP_EMITTER``: ``triton`` (default) or ``cuda`` (CUDA C through NVRTC for
    loop fusions, Triton for the rest and for what the CUDA C emitter declines)."""
    v = os.environ.get(ENV, "").strip().lower() or "triton"
    if v not in EMITTERS:
        raise CudaCodegenError(f"{ENV}={os.environ.get(ENV)!r}: expected one of "
                               f"{', '.join(EMITTERS)}")
    return v

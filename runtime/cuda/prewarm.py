"""Compile-time work started early, in the background, so that the first call waits less
(issue 13; benchmarks/compile_time.md has the phases).

- ``start(device)``, when the CUDA client is made (once per process): a thread computes the
  hash Triton keys every cache entry with (its sources and its 400 MB library: ~0.3 s,
  paid once per process by the first kernel launch, warm or cold) and builds the native
  launcher (``runtime/cuda/native``: a C++ compile of seconds, once per cache directory).
  Both only fill caches that the first call would otherwise fill itself; ``wait()`` (before
  the native launcher is loaded) joins the thread so that the library is never built twice.
- ``start_workers(exe)``, when an executable's kernels are known (end of codegen): the
  Triton compile workers for the variants it will compile (``codegen/triton/parallel.py``),
  started now so that they have imported Triton by the time the first call sends jobs.
"""
from __future__ import annotations

import threading
from typing import Any, Optional

_THREAD: Optional[threading.Thread] = None


def _triton_key() -> None:
    from triton.runtime.cache import triton_key
    triton_key()


def _native_library() -> None:
    from .native import build
    from .native.front import disabled
    if disabled() is None:
        build()


def _work() -> None:
    for step in (_triton_key, _native_library):
        try:
            step()
        except Exception:  # noqa: BLE001  (the first call does it and reports what fails)
            pass


def start(device: Any) -> None:
    """Start the background thread (once per process; not for Triton's interpreter)."""
    global _THREAD
    from .backend import _interpret
    if _THREAD is not None or getattr(device, "type", "") != "cuda" or _interpret():
        return
    _THREAD = threading.Thread(target=_work, name="hlotk-prewarm", daemon=True)
    _THREAD.start()


def wait() -> None:
    """Until the background work is done (a no-op when none was started)."""
    if _THREAD is not None:
        _THREAD.join()


def start_workers(exe: Any) -> None:
    """Compile workers for ``exe``'s new kernel variants, if it will compile enough of them."""
    if not exe.on_gpu or exe._precompiled:
        return
    try:
        from codegen.triton.parallel import start_for
        start_for([(k, c) for k, configs in exe.variants() for c in configs])
    except Exception:  # noqa: BLE001  (the first call starts them, or compiles at launches)
        pass

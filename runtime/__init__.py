"""hlotk's runtime: PJRT-shaped client/devices/buffers/executables and the ``jit`` front door.

    import runtime
    c = runtime.client("cpu")            # Client: .devices(), .compile(module), .buffer_from_pyval
    f = runtime.jit(fn)                  # like jax.jit: f(*args), f.lower(*args).compile()
"""
from __future__ import annotations

from .analysis import CompiledMemoryStats  # noqa: F401
from .client import (BACKENDS, PIPELINES, Buffer, Client, ClientError, Device,  # noqa: F401
                     LoadedExecutable, client)
from .jit import CacheInfo, Compiled, Jitted, Lowered, jit  # noqa: F401

# On a GPU machine: Triton's stored key and the native launcher's build (once per machine)
# start now, in the background (runtime/cuda/prewarm.py; nothing happens without a GPU).
from .cuda import prewarm as _prewarm

_prewarm.start_at_import()

__all__ = ["client", "jit", "Client", "Device", "Buffer", "LoadedExecutable", "Jitted",
           "Lowered", "Compiled", "CompiledMemoryStats", "CacheInfo", "ClientError",
           "BACKENDS", "PIPELINES"]

"""The CUDA backend: ``runtime.jit(f, backend="cuda")``.

PyTorch is the device layer (one arena per executable, cuBLAS through ``torch.mm(out=)``,
CUDA graphs through ``torch.cuda.CUDAGraph``, JAX arrays in and out through DLPack) and
Triton runs the generated kernels (``codegen.triton``). Modules:

- ``arena``: device memory, typed strided views at buffer-assignment offsets;
- ``thunks``: kernel launches, library calls, copies, host-driven control flow, host
  fallbacks;
- ``graphs``: straight-line thunk runs captured as CUDA graphs and replayed;
- ``native``: the whole executable as one CUDA graph launched from an XLA FFI custom call
  inside ``jax.jit`` (JAX's C++ dispatch; addresses patched per call by a small C++ file);
- ``backend``: ``CudaExecutable`` (build + run + reports) and ``CudaBackend``
  (``runtime.client.BACKENDS["cuda"]``).

Importing this package needs neither torch nor a GPU; building an executable does.
"""
from __future__ import annotations

from .errors import (CudaBackendError, DeviceMemoryError, KernelCompileError,  # noqa: F401
                     NativeLauncherError, NativeLauncherWarning, NoCudaDeviceError)


def __getattr__(name: str):
    # CudaExecutable / CudaBackend import lazily (their module imports the passes).
    if name in ("CudaExecutable", "CudaBackend", "resolve_device"):
        from . import backend
        return getattr(backend, name)
    raise AttributeError(name)


def executable_of(compiled) -> "CudaExecutable":  # noqa: F821
    """The CudaExecutable behind a ``runtime.jit(...).lower(...).compile()`` result (for
    ``.describe()``, ``.report()``, ``.graphs.enabled = False`` ...)."""
    exe = getattr(getattr(compiled, "executable", compiled)._body, "executable", None)
    from .backend import CudaExecutable
    if not isinstance(exe, CudaExecutable):
        raise CudaBackendError(f"{compiled!r} was not compiled for backend 'cuda'")
    return exe

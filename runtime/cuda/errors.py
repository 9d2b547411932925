"""Errors of the CUDA backend: each says what failed and what to do about it."""
from __future__ import annotations

from hlo.errors import HlotkError


class CudaBackendError(HlotkError):
    """Base of the CUDA backend's errors."""


class NoCudaDeviceError(CudaBackendError):
    """``backend="cuda"`` was asked for where torch is missing or sees no GPU."""


class DeviceMemoryError(CudaBackendError):
    """The device has too little free memory for an executable's arena or outputs."""


class KernelCompileError(CudaBackendError):
    """Triton could not compile (or launch) the kernel generated for a fusion."""


class NativeLauncherError(CudaBackendError):
    """The native launcher (runtime/cuda/native) could not be built or loaded, or a launch
    through it failed; the message names the compiler, the driver call or the argument."""


class NativeLauncherWarning(UserWarning):
    """The native launcher could not be used (build, driver or capture diff failed): calls
    take the Python path, with the same results; the message says why."""

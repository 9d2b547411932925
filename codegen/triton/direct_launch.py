"""Launch Triton-compiled kernels through the CUDA driver, without Triton's C launcher.

Triton 3.6 launches a kernel through a small C extension it compiles with gcc once per
kernel signature (``__triton_launcher``, 0.2-0.5 s each, cold) and loads cubins through
another one (``cuda_utils``, gcc-built once per Triton cache directory). On a cold first
call of a one-kernel program those builds were most of hlotk's time (issue 13,
benchmarks/compile_time.md). Here, instead:

    launch(fn, grid, args, kwargs)    # == fn[grid](*args, **kwargs)

asks Triton for the compiled kernel (``fn.warmup``: its specialization, its on-disk cache,
or a compile), loads the cubin with ``cuModuleLoadData`` (ctypes on libcuda, once per kernel
variant and device) and launches it with ``cuLaunchKernelEx``, the parameters laid out as
Triton's launcher lays them out (``launch_params.py``; the count and size of each is checked
against the cubin's own declaration, ``cuFuncGetParamInfo``, before the first launch). Later
launches with arguments of the same types, 16-byte alignment and scalar values reuse the
loaded function: a dictionary lookup, a ``struct.pack_into`` and one driver call.

A kernel this cannot launch (tensor descriptors, clusters, scratch memory, another Triton
version, a cubin whose parameters differ from the plan, more shared memory or threads than
the device allows: Triton raises its own error there) keeps Triton's launch, and one debug
line on the ``hlotk.triton.launch`` logger says why. So do launches inside
``parallel.collecting()`` (Triton's JIT reports them, nothing runs), under Triton's launch
hooks (profilers), and every launch with ``HLOTK_TRITON_LAUNCH=triton``.

``install_driver()`` (at the CUDA client's creation, ``runtime/cuda/prewarm.py``) makes
Triton's active driver one that answers the device, stream and target from torch and makes
Triton's own CUDA driver (and with it ``cuda_utils``) only when something asks for more (a
launch that keeps Triton's path).
"""
from __future__ import annotations

import ctypes
import logging
import os
import struct
import threading
from typing import Any, Optional, Sequence

from . import launch_params as lp
from .elemental import TritonCodegenError
from .parallel import collecting_now

ENV = lp.ENV
_LOG = logging.getLogger("hlotk.triton.launch")

# What this process did (benchmarks/compile_time.py reports it): kernels loaded for the
# direct launch, kernels left to Triton (with why), direct launches.
STATS: dict[str, Any] = {"loaded": 0, "load_s": 0.0, "triton": 0, "launches": 0,
                         "why_triton": {}}


def mode() -> str:
    """``HLOTK_TRITON_LAUNCH``: ``direct`` (default) or ``triton`` (Triton's own launcher for
    every kernel, as before issue 13's direct launch)."""
    try:
        return lp.launch_mode(os.environ)
    except ValueError as e:
        raise TritonCodegenError(str(e)) from None


_ENABLED: Optional[str] = None      # "" (on), or why the whole process keeps Triton's launch


def disabled() -> str:
    """"" where this process launches directly, else why it does not (the mode, Triton's
    interpreter, an unknown Triton version, no CUDA driver library)."""
    global _ENABLED
    if mode() != "direct":
        return f"{ENV}={os.environ.get(ENV)}"
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "Triton's interpreter"
    if _ENABLED is None:
        import triton
        _ENABLED = lp.supported_version(triton.__version__) or ""
        if not _ENABLED:
            try:
                _cuda()
            except TritonCodegenError as e:
                _ENABLED = str(e)
        if _ENABLED:
            _LOG.debug("Triton's launcher for every kernel: %s", _ENABLED)
    return _ENABLED


# --- the CUDA driver -------------------------------------------------------------------------
class _LaunchAttr(ctypes.Structure):     # CUlaunchAttribute: id, pad to 8, 64-byte value
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):   # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


assert ctypes.sizeof(_LaunchAttr) == 72 and ctypes.sizeof(_LaunchConfig) == 56

# cuda.h values
ATTR_COOPERATIVE = 2                    # CU_LAUNCH_ATTRIBUTE_COOPERATIVE
ATTR_PDL = 6                            # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
FUNC_MAX_THREADS, FUNC_SHARED_STATIC, FUNC_LOCAL_BYTES, FUNC_NUM_REGS = 0, 1, 3, 4
FUNC_MAX_DYNAMIC_SHARED = 8             # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
DEV_SHARED_PER_SM, DEV_SHARED_OPTIN = 81, 97
CACHE_PREFER_SHARED = 1
ERR_INVALID_VALUE, ERR_INVALID_CONTEXT = 1, 201
STATIC_SHARED_LIMIT = 49152             # above this a kernel must opt in (Triton's rule)

_CU: Any = None
_CU_ERROR = ""


def _cuda() -> Any:
    """libcuda with the entry points used here typed; raises TritonCodegenError."""
    global _CU, _CU_ERROR
    if _CU is not None:
        return _CU
    if _CU_ERROR:
        raise TritonCodegenError(_CU_ERROR)
    c = ctypes
    vp, i, sz = c.c_void_p, c.c_int, c.c_size_t
    sig = {
        "cuGetErrorName": [i, c.POINTER(c.c_char_p)],
        "cuCtxGetCurrent": [c.POINTER(vp)],
        "cuCtxSetCurrent": [vp],
        "cuDeviceGet": [c.POINTER(i), i],
        "cuDevicePrimaryCtxRetain": [c.POINTER(vp), i],
        "cuDeviceGetAttribute": [c.POINTER(i), i, i],
        "cuModuleLoadData": [c.POINTER(vp), c.c_char_p],
        "cuModuleGetFunction": [c.POINTER(vp), vp, c.c_char_p],
        "cuFuncGetAttribute": [c.POINTER(i), i, vp],
        "cuFuncSetAttribute": [vp, i, i],
        "cuFuncSetCacheConfig": [vp, i],
        "cuFuncGetParamInfo": [vp, sz, c.POINTER(sz), c.POINTER(sz)],
        "cuLaunchKernelEx": [c.POINTER(_LaunchConfig), vp, c.POINTER(vp), c.POINTER(vp)],
    }
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        for name, args in sig.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = i, args
    except (OSError, AttributeError) as e:
        # cuFuncGetParamInfo needs a driver for CUDA 12.4 or newer
        _CU_ERROR = f"no usable CUDA driver library for the direct launch: {e}"
        raise TritonCodegenError(_CU_ERROR) from None
    _CU = lib
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        name = ctypes.c_char_p()
        _CU.cuGetErrorName(status, ctypes.byref(name))
        raise TritonCodegenError(f"{what} failed: {(name.value or b'CUDA error').decode()} "
                                 f"({status})")


def _ensure_context(device: int) -> None:
    """The device's primary context current on this thread (torch's, normally already)."""
    cu = _cuda()
    ctx = ctypes.c_void_p()
    _check(cu.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:
        dev = ctypes.c_int()
        _check(cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        _check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        _check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def _func_attr(fn: ctypes.c_void_p, attr: int) -> int:
    v = ctypes.c_int()
    _check(_CU.cuFuncGetAttribute(ctypes.byref(v), attr, fn), "cuFuncGetAttribute")
    return v.value


def _device_attr(device: int, attr: int) -> int:
    v = ctypes.c_int()
    _check(_CU.cuDeviceGetAttribute(ctypes.byref(v), attr, device), "cuDeviceGetAttribute")
    return v.value


def declared_params(fn: ctypes.c_void_p) -> list[tuple[int, int]]:
    """(offset, size) of each parameter of a loaded function, as the cubin declares them."""
    out: list[tuple[int, int]] = []
    off, size = ctypes.c_size_t(), ctypes.c_size_t()
    while True:
        r = _CU.cuFuncGetParamInfo(fn, len(out), ctypes.byref(off), ctypes.byref(size))
        if r == ERR_INVALID_VALUE:        # past the last parameter
            return out
        _check(r, "cuFuncGetParamInfo")
        out.append((off.value, size.value))
        if len(out) > 4096:
            raise TritonCodegenError("a kernel with more than 4096 parameters")


class DirectKernel:
    """One compiled kernel variant loaded into one device's context, with the host buffer
    its parameters are packed into (one slot each, ``launch_params``) and a pointer per slot."""

    def __init__(self, compiled: Any, plan: lp.ParamPlan, meta: lp.LaunchMeta,
                 device: int, tail: Sequence[tuple[str, Any]]) -> None:
        cu = _cuda()
        self.compiled, self.plan, self.meta = compiled, plan, meta
        self.tail = tuple(tail)     # (name, default) of the parameters after the positionals
        _ensure_context(device)
        shared_optin = _device_attr(device, DEV_SHARED_OPTIN)
        if meta.shared > shared_optin:
            raise lp.Unsupported(f"{meta.shared} bytes of shared memory, the device allows "
                                 f"{shared_optin} (Triton's launch raises OutOfResources)")
        self.module, self.fn = ctypes.c_void_p(), ctypes.c_void_p()
        cubin = compiled.asm["cubin"]
        _check(cu.cuModuleLoadData(ctypes.byref(self.module), cubin), "cuModuleLoadData")
        _check(cu.cuModuleGetFunction(ctypes.byref(self.fn), self.module, meta.name.encode()),
               f"cuModuleGetFunction({meta.name})")
        if meta.num_warps * 32 > _func_attr(self.fn, FUNC_MAX_THREADS):
            raise lp.Unsupported(f"{meta.num_warps} warps exceed the kernel's thread limit "
                                 "(Triton's launch raises OutOfResources)")
        why = lp.check_layout(plan, declared_params(self.fn))
        if why:
            raise lp.Unsupported(why)
        if meta.shared > STATIC_SHARED_LIMIT and shared_optin > STATIC_SHARED_LIMIT:
            # as Triton's loader does: prefer shared memory, opt in to all the device has
            _check(cu.cuFuncSetCacheConfig(self.fn, CACHE_PREFER_SHARED), "cuFuncSetCacheConfig")
            static = _func_attr(self.fn, FUNC_SHARED_STATIC)
            _check(cu.cuFuncSetAttribute(self.fn, FUNC_MAX_DYNAMIC_SHARED,
                                         shared_optin - static), "cuFuncSetAttribute")
        # what Triton's loader records on the compiled kernel (callers read registers, spills)
        for attr, value in (("n_regs", _func_attr(self.fn, FUNC_NUM_REGS)),
                            ("n_spills", _func_attr(self.fn, FUNC_LOCAL_BYTES) // 4)):
            if getattr(compiled, attr, None) is None:
                try:
                    setattr(compiled, attr, value)
                except AttributeError:
                    pass
        self.buf = ctypes.create_string_buffer(plan.nbytes)
        base = ctypes.addressof(self.buf)
        self.params = (ctypes.c_void_p * plan.count)(*(base + lp.SLOT * k
                                                       for k in range(plan.count)))
        attrs = [(ATTR_PDL, meta.launch_pdl), (ATTR_COOPERATIVE, meta.cooperative)]
        attrs = [a for a, on in attrs if on]
        self.attrs = (_LaunchAttr * max(len(attrs), 1))()
        for k, a in enumerate(attrs):
            self.attrs[k].id, self.attrs[k].value = a, 1
        self.config = _LaunchConfig(blockDimX=32 * meta.num_warps, blockDimY=1, blockDimZ=1,
                                    sharedMemBytes=meta.shared, attrs=self.attrs,
                                    numAttrs=len(attrs))
        self.lock = threading.Lock()

    def launch(self, grid: Sequence[int], args: Sequence[Any], kwargs: dict,
               stream: int) -> None:
        gx = int(grid[0])
        gy = int(grid[1]) if len(grid) > 1 else 1
        gz = int(grid[2]) if len(grid) > 2 else 1
        if gx * gy * gz <= 0:
            return
        bound = list(args)
        for name, default in self.tail:
            bound.append(kwargs[name] if name in kwargs else default)
        vals = lp.values(self.plan, bound)
        cfg = self.config
        with self.lock:        # one buffer per kernel: packed and handed over under the lock
            struct.pack_into(self.plan.fmt, self.buf, 0, *vals)
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = gx, gy, gz
            cfg.hStream = stream
            r = _CU.cuLaunchKernelEx(ctypes.byref(cfg), self.fn, self.params, None)
            if r == ERR_INVALID_CONTEXT:      # a thread without torch's context current
                _ensure_context(_current_device())
                r = _CU.cuLaunchKernelEx(ctypes.byref(cfg), self.fn, self.params, None)
        _check(r, f"cuLaunchKernelEx({self.meta.name})")


# --- launching ----------------------------------------------------------------------------
def _current_device() -> int:
    import torch
    return torch.cuda.current_device()


def _raw_stream(device: int) -> int:
    import torch
    return torch._C._cuda_getCurrentRawStream(device)


def _arg_key(a: Any) -> Any:
    """What of an argument Triton's specialization can depend on (or more): a tensor's dtype
    and 16-byte alignment, a scalar's type and value."""
    t = type(a)
    if t is int or t is float or t is bool or a is None:
        return (t, a)
    ptr = getattr(a, "data_ptr", None)
    if ptr is not None:
        return (a.dtype, ptr() % 16 == 0)
    hash(a)                 # unhashable: a TypeError, and Triton launches it
    return (t, a)


def _memo(fn: Any) -> dict:
    memo = fn.__dict__.get("_hlotk_direct")
    if memo is None:
        memo = fn.__dict__["_hlotk_direct"] = {}
    return memo


def _hooks_set() -> bool:
    """Whether Triton's launch hooks would call anything (a profiler's): Triton 3.6 keeps
    them as chains, empty by default; older ones as None or a function."""
    from triton import knobs
    rt = knobs.runtime
    return any(h is not None and bool(getattr(h, "calls", True))
               for h in (rt.launch_enter_hook, rt.launch_exit_hook))


def launch(fn: Any, grid: Any, args: Sequence[Any], kwargs: dict) -> Any:
    """``fn[grid](*args, **kwargs)`` (on torch's current stream and device), launched
    directly where it can be; returns Triton's compiled kernel (as Triton's launch does)."""
    if disabled() or collecting_now() or callable(grid) or _hooks_set():
        return fn[grid](*args, **kwargs)
    device = _current_device()
    try:
        key = (device, len(args), tuple(_arg_key(a) for a in args),
               tuple(sorted((k, _arg_key(v)) for k, v in kwargs.items())))
    except TypeError:        # an unhashable argument: Triton's launch
        return fn[grid](*args, **kwargs)
    memo = _memo(fn)
    entry = memo.get(key)
    if entry is None:
        entry = _prepare(fn, grid, args, kwargs, device)
        if entry is None:           # Triton compiled nothing (a hook stopped it): no memo
            return fn[grid](*args, **kwargs)
        memo[key] = entry
    if isinstance(entry, str):
        return fn[grid](*args, **kwargs)
    entry.launch(grid, args, kwargs, _raw_stream(device))
    STATS["launches"] += 1
    return entry.compiled


def _prepare(fn: Any, grid: Any, args: Sequence[Any], kwargs: dict,
             device: int) -> Any:
    """A DirectKernel for this launch's variant, or why Triton launches it (a string), or
    None where Triton returned no kernel."""
    import time
    t0 = time.perf_counter()
    install_driver()
    try:
        compiled = fn.warmup(*args, grid=grid, **kwargs)
    except Exception as e:  # noqa: BLE001  (Triton's launch raises it again, as before)
        return f"Triton's warmup raised {type(e).__name__}"
    if compiled is None:
        return None
    if hasattr(compiled, "result"):          # an asynchronous compile's future
        compiled = compiled.result()
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", "?")
    try:
        src = getattr(compiled, "src", None)
        signature = getattr(src, "signature", None)
        if not isinstance(signature, dict):
            raise lp.Unsupported("the compiled kernel has no signature to lay out")
        plan = lp.plan_params(signature)
        meta = lp.launch_meta(compiled.metadata)
        names = list(signature)
        params = getattr(fn, "params", None) or []
        defaults = [getattr(getattr(p, "_param", None), "default", None) for p in params]
        tail = [(n, defaults[i] if i < len(defaults) else None)
                for i, n in enumerate(names) if i >= len(args)]
        kernel = DirectKernel(compiled, plan, meta, device, tail)
    except Exception as e:  # noqa: BLE001  (anything unexpected: Triton's launch, as before)
        why = str(e) if isinstance(e, (lp.Unsupported, TritonCodegenError)) else \
            f"{type(e).__name__}: {e}"
        STATS["triton"] += 1
        STATS["why_triton"][name] = why
        _LOG.debug("kernel %s keeps Triton's launch: %s", name, why)
        return why
    STATS["loaded"] += 1
    STATS["load_s"] += time.perf_counter() - t0
    return kernel


# --- Triton's driver, without cuda_utils until something needs it ---------------------------
_LAZY_CLASS: Any = None


def install_driver() -> bool:
    """Make Triton's active driver a ``lazy_driver()`` where Triton has made none yet and
    the direct launch is on; returns whether one is active."""
    from triton.runtime.driver import driver
    active = getattr(driver, "_active", None)
    if active is not None or getattr(driver, "_default", None) is not None:
        return _LAZY_CLASS is not None and isinstance(active, _LAZY_CLASS)
    if disabled():
        return False
    try:
        import torch
        if torch.version.hip is not None or not torch.cuda.is_available():
            return False
        driver.set_active(lazy_driver())
    except Exception as e:  # noqa: BLE001  (Triton's own driver, as before)
        _LOG.debug("Triton's own CUDA driver: %s", e)
        return False
    return True


def lazy_driver() -> Any:
    """A Triton ``GPUDriver`` for compiling and warming up (device, stream, target and
    benchmarking answered from torch); anything else it is asked for (``utils``,
    ``launcher_cls``: a launch that keeps Triton's path) comes from Triton's own driver,
    made (and ``cuda_utils`` built) on that first use."""
    global _LAZY_CLASS
    if _LAZY_CLASS is None:
        _LAZY_CLASS = _lazy_driver_class()
    return _LAZY_CLASS()


def _lazy_driver_class() -> Any:
    from triton.backends.driver import GPUDriver

    class LazyCudaDriver(GPUDriver):
        def __init__(self) -> None:
            super().__init__()
            self._targets: dict[int, Any] = {}

        @classmethod
        def is_active(cls) -> bool:
            return True

        def get_current_target(self) -> Any:
            from triton.backends.compiler import GPUTarget
            dev = self.get_current_device()
            target = self._targets.get(dev)
            if target is None:
                major, minor = self.get_device_capability(dev)
                target = self._targets[dev] = GPUTarget("cuda", major * 10 + minor, 32)
            return target

        def get_active_torch_device(self) -> Any:
            import torch
            return torch.device("cuda", self.get_current_device())

        def get_device_interface(self) -> Any:
            import torch
            return torch.cuda

        def map_python_to_cpp_type(self, ty: str) -> str:
            from triton.backends.nvidia.driver import ty_to_cpp
            return ty_to_cpp(ty)

        def get_benchmarker(self) -> Any:
            from triton.testing import do_bench
            return do_bench

        def get_empty_cache_for_benchmark(self) -> Any:
            import torch     # 256 MB written between benchmark runs, as Triton's driver
            return torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int, device="cuda")

        def clear_cache(self, cache: Any) -> None:
            cache.zero_()

        def __getattr__(self, name: str) -> Any:
            if name.startswith("__") or name == "_targets":
                raise AttributeError(name)
            from triton.runtime.driver import driver
            return getattr(driver.default, name)
    return LazyCudaDriver

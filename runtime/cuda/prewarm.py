"""Compile-time work started early, in the background, so that the first call waits less
(issue 13; benchmarks/compile_time.md has the phases).

- ``start_at_import()`` (``import runtime``, on a machine with an NVIDIA GPU, when JAX is
  imported already): a thread builds the native launcher library if this machine has none
  yet (``runtime/cuda/native``: a C++ compile of ~3 s, once per machine and not per cache
  directory; the machine cache is ``codegen.cache.machine_cache_root()``).
- ``start(device)`` (when the CUDA client is made), once per process: Triton's installation
  key is read from the machine cache (``codegen/triton/triton_key.py``: ~3 ms, here);
  without a stored one a thread hashes Triton (~0.3 s) and stores it. The native library's
  thread starts here too if it did not at import. Triton's active driver becomes the direct
  launch's (``codegen/triton/direct_launch.py``: no ``cuda_utils`` build), and the modules
  Triton's first argument specialization imports are imported here
  (``import_specialization_modules``).
- Unless ``HLOTK_LOOP_EMITTER=triton``, when the CUDA client is made: NVRTC loaded and a tiny
  kernel compiled in a thread (``codegen/cuda_c/nvrtc.py``: NVRTC's own start-up).
- ``start_libraries(module, device)`` (when the client's compile of a module with a
  convolution begins, before its passes): a thread runs a tiny bf16 convolution, so that
  cuDNN's libraries, a handle and its heuristics are set up while the passes and codegen
  run (H200, conv_bn_grad: the thread took 0.08 s and was never waited for; the first
  call's library thunks went from 0.016-0.019 s to 0.002 with library_warm.py beside it;
  NOTES "i13-resnet-cold"). Torch keeps cuDNN's execution plans per thread, so the
  program's own shapes are set up later, on the launching thread, while the compile pool
  works (runtime/cuda/library_warm.py); the handle this thread made goes back to torch's
  pool when it ends and the launching thread takes it. The first run waits for it
  (``wait_for("cudnn")``) before it launches anything. ``HLOTK_PREWARM_LIBRARIES=0``: off.
- ``freeze_gc()`` (when the CUDA client is made): the objects alive then go to the
  cyclic collector's permanent generation, so that the first call's full collection does
  not re-scan every imported library (``HLOTK_GC_FREEZE=0``: off).
- ``wait()`` (before the native launcher is loaded) joins the threads, so that the library
  is never built twice in a process (processes take a file lock while building).
- The Triton compile pool (``codegen/triton/parallel.py``) starts early too: a few workers
  (``HLOTK_COMPILE_EARLY``, default 4; 0 turns this off) at ``import runtime`` on a GPU
  machine and when the CUDA client is made (``runtime.jit(..., backend="cuda")``), each
  importing Triton and compiling a small kernel while the program is traced and optimized,
  as Inductor warms its compile pool; ``start_workers(exe)``, when an executable's kernels
  are known (end of codegen), grows it to the variants it will compile.

The threads only call functions of modules imported before they start (imports from two
threads at once can meet in a cycle and hand one of them a half-initialized module).
Everything here only fills caches the first call would otherwise fill itself; failures are
left to the first call, which reports them. ``HLOTK_PREWARM=0`` turns the import-time start
off (the native build and the early compile workers).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

_THREADS: dict[str, threading.Thread] = {}
_LOCK = threading.Lock()
# Seconds of each background step and of the first call's wait for them (benchmarks).
STATS: dict[str, float] = {"triton_key_s": 0.0, "native_s": 0.0, "wait_s": 0.0,
                           "triton_imports_s": 0.0, "nvrtc_s": 0.0, "cudnn_s": 0.0,
                           "cudnn_wait_s": 0.0}


def _timed(what: str, fn: Callable[[], Any]) -> Callable[[], None]:
    def step() -> None:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception:  # noqa: BLE001  (the first call does it and reports what fails)
            pass
        STATS[what + "_s"] = time.perf_counter() - t0
    return step


def _spawn(name: str, step: Callable[[], None]) -> None:
    with _LOCK:
        if name in _THREADS:
            return
        t = threading.Thread(target=step, name=f"hlotk-prewarm-{name}", daemon=True)
        _THREADS[name] = t
        t.start()


def _start_native() -> None:
    """The native library's build in a thread; its modules imported here, first."""
    import jax.ffi  # noqa: F401  (build() reads its include directory)

    import codegen.cache  # noqa: F401
    from . import native
    from .native.front import disabled
    if disabled() is None:
        _spawn("native", _timed("native", native.build))


def _interpreting() -> bool:
    v = os.environ.get("TRITON_INTERPRET")
    return v is not None and v not in ("0", "false", "False", "no", "off")


def gpu_present() -> bool:
    """Whether this machine has an NVIDIA GPU this process may use, without touching CUDA
    (the driver's device node, and CUDA_VISIBLE_DEVICES not emptied)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")


def start_at_import() -> None:
    """From ``import runtime``: the native library's build, where a GPU is present and JAX
    is imported already (not for Triton's interpreter, not with ``HLOTK_PREWARM=0``)."""
    if os.environ.get("HLOTK_PREWARM", "1") in ("0", "false", "no", "off"):
        return
    if _interpreting() or "jax" not in sys.modules or not gpu_present():
        return
    try:
        _start_native()
    except Exception:  # noqa: BLE001  (the client's start or the first call does it)
        pass
    _start_pool(where="import")


def _start_pool(target: str = "", where: str = "") -> None:
    """The compile pool's early workers (where Triton is installed)."""
    try:
        import importlib.util
        if importlib.util.find_spec("triton") is None:
            return
        from codegen.triton.parallel import start_early
        start_early(target, where)
    except Exception:  # noqa: BLE001  (the first call starts workers, or compiles at launches)
        pass


def start(device: Any) -> None:
    """When the CUDA client is made (once per process; not for Triton's interpreter)."""
    if getattr(device, "type", "") != "cuda" or _interpreting():
        return
    try:
        # Triton's driver answered from torch, Triton's own (cuda_utils) built only if a
        # launch needs it (codegen/triton/direct_launch.py); before the freeze, which
        # then covers the modules imported here
        from codegen.triton.direct_launch import install_driver
        install_driver()
        import_specialization_modules()
    except Exception:  # noqa: BLE001  (no Triton, or Triton's own driver: as before)
        pass
    freeze_gc()
    try:
        from codegen.triton import triton_key
        if triton_key.install(compute=False) is None:
            triton_key.original()           # Triton's modules imported here, not there
            _spawn("triton_key", _timed("triton_key", triton_key.install))
    except Exception:  # noqa: BLE001  (no Triton: the launches say so)
        pass
    try:
        _start_native()
    except Exception:  # noqa: BLE001
        pass
    _start_nvrtc(device)
    if os.environ.get("HLOTK_PREWARM", "1") not in ("0", "false", "no", "off"):
        try:
            import torch
            major, minor = torch.cuda.get_device_capability(device)
            _start_pool(f"cuda,{major * 10 + minor},32", "client")
        except Exception:  # noqa: BLE001
            _start_pool(where="client")


def _start_nvrtc(device: Any) -> None:
    """Unless ``HLOTK_LOOP_EMITTER=triton``: NVRTC loaded and one tiny kernel compiled in a
    thread, so that the first loop kernel's compile (started at codegen) does not also pay
    NVRTC's start-up in the process (codegen/cuda_c/nvrtc.py)."""
    try:
        from codegen.cuda_c import loop_emitter, nvrtc
        if loop_emitter() == "triton":
            return
        import torch
        major, minor = torch.cuda.get_device_capability(device)
    except Exception:  # noqa: BLE001  (the executable reports a bad setting or no NVRTC)
        return
    _spawn("nvrtc", _timed("nvrtc", lambda: nvrtc.warm_up(f"{major}{minor}")))


# What Triton 3.6's argument specialization (C++, ``native_specialize_impl``) imports on its
# first use in a process, to tell tensor descriptors apart: gluon's packages and Triton's
# tensor-descriptor tools, ~60 modules (they were in every first call's imports, i13-warm).
SPECIALIZATION_MODULES = ("triton.tools.tensor_descriptor",
                          "triton.experimental.gluon.nvidia.hopper",
                          "triton.experimental.gluon.language._layouts",
                          "triton.experimental.gluon.language.amd._layouts",
                          "triton.experimental.gluon.language.nvidia.blackwell",
                          "triton.language.extra.libdevice")


def import_specialization_modules() -> None:
    """Import SPECIALIZATION_MODULES once per process, here (the CUDA client's creation,
    beside Triton's other per-process start-up), so that the first call's first kernel
    specialization does not; a module this Triton lacks is skipped."""
    import importlib
    t0 = time.perf_counter()
    for name in SPECIALIZATION_MODULES:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001  (another Triton: it imports what it needs)
                pass
    STATS["triton_imports_s"] = time.perf_counter() - t0


_FROZEN = False


def freeze_gc() -> bool:
    """Move every object the process holds now (the imported libraries: JAX, torch, Triton,
    hlotk; ~260K objects on this CPU box, more with CUDA) into the collector's permanent
    generation, once per process, when the CUDA client is made. Python's full collections
    otherwise re-scan all of them: one such pass is ~0.13 s here, and a first call (which
    allocates enough to trigger one) paid it (issue 13, benchmarks/NOTES.md "i13-warm").
    Frozen objects are still freed by reference counting; only cyclic garbage among them is
    left uncollected. ``HLOTK_GC_FREEZE=0`` leaves the collector alone. Returns whether it
    froze now."""
    global _FROZEN
    if _FROZEN or os.environ.get("HLOTK_GC_FREEZE", "1").strip().lower() in (
            "0", "false", "no", "off"):
        return False
    import gc
    _FROZEN = True
    gc.freeze()
    return True


def wait() -> None:
    """Until the background work is done (a no-op when none was started)."""
    for t in list(_THREADS.values()):
        if t.is_alive():
            t0 = time.perf_counter()
            t.join()
            STATS["wait_s"] += time.perf_counter() - t0


def wait_for(name: str) -> None:
    """Until the background step ``name`` is done (a no-op when none was started); the
    wait goes to ``STATS[name + "_wait_s"]``."""
    t = _THREADS.get(name)
    if t is not None and t.is_alive():
        t0 = time.perf_counter()
        t.join()
        key = name + "_wait_s"
        STATS[key] = STATS.get(key, 0.0) + time.perf_counter() - t0


def libraries_enabled() -> bool:
    """``HLOTK_PREWARM_LIBRARIES`` (default on)."""
    return os.environ.get("HLOTK_PREWARM_LIBRARIES", "1").strip().lower() not in (
        "0", "off", "false", "no")


def has_convolution(module: Any) -> bool:
    """Whether any computation of ``module`` has a ``convolution``."""
    return any(i.opcode == "convolution" for c in module.computations for i in c.instructions)


def start_libraries(module: Any, device: Any) -> bool:
    """cuDNN's start-up in a thread, once per process, when ``module`` has a convolution
    (the module's docstring says what and why). Returns whether a thread started now."""
    if getattr(device, "type", "") != "cuda" or _interpreting() or not libraries_enabled():
        return False
    if "cudnn" in _THREADS or not has_convolution(module):
        return False
    try:
        import torch
        import torch.nn.functional  # noqa: F401  (imported here, not in the thread)
    except Exception:  # noqa: BLE001  (no torch: the first call says so)
        return False
    _spawn("cudnn", _timed("cudnn", lambda: _cudnn_start_up(device)))
    return True


def _cudnn_start_up(device: Any) -> None:
    """A 3x3 bf16 channels-last convolution of 8 channels, finished on this thread's stream
    before it ends (torch's Python ops leave the GIL while cuDNN works, so the passes on
    the main thread go on)."""
    import torch
    import torch.nn.functional as F
    with torch.cuda.device(device):
        last = torch.channels_last
        x = torch.zeros((1, 8, 8, 8), device=device, dtype=torch.bfloat16).contiguous(
            memory_format=last)
        w = torch.zeros((8, 8, 3, 3), device=device, dtype=torch.bfloat16).contiguous(
            memory_format=last)
        F.conv2d(x, w, padding=1)
        torch.cuda.current_stream(device).synchronize()


def start_workers(exe: Any) -> None:
    """Compile workers for ``exe``'s new kernel variants, if it will compile enough of them."""
    if not exe.on_gpu or exe._precompiled:
        return
    try:
        from codegen.triton.parallel import start_for
        # flash attention: a forward's few candidates, a backward's two kernels each
        flash = sum(8 if "backward" in t.call.__module__ else 4 for t in exe._flash_thunks())
        start_for([(k, c) for k, configs in exe.variants() for c in configs], extra=flash)
    except Exception:  # noqa: BLE001  (the first call starts them, or compiles at launches)
        pass

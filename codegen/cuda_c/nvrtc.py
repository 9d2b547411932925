"""NVRTC through ctypes: CUDA C++ source -> cubin, in this process, and a cubin cache.

``libnvrtc`` comes from ``$HLOTK_NVRTC`` (a path), else the NVIDIA pip packages beside
torch (``nvidia/cu13/lib``, ``nvidia/cuda_nvrtc/lib``), torch's own lib folder, or a CUDA
toolkit. Measured on the H200 (benchmarks/nvrtc_probe.py): a GIOU loop kernel compiles in
0.017-0.023 s, Triton's compile of the same kernel 0.14-0.16 s.

ctypes drops the GIL around each foreign call, and NVRTC is thread-safe, so a thread pool
compiles a program's kernels concurrently in the main process (``compile_async``).

Cubins are cached on disk (``$HLOTK_CACHE_DIR/cuda_c/<key>.cubin``), keyed by the source
hash, NVRTC's version and the GPU architecture, and stored with a checksum so a truncated
file is recompiled, not loaded: a warm process compiles nothing.
"""
from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from codegen.cache import cache_root, content_key

from .emitter import CudaCodegenError, compile_text

ENV_PATH = "HLOTK_NVRTC"
_MAGIC = b"hlotk-cubin1"


class NvrtcCompileError(CudaCodegenError):
    """NVRTC rejected a generated kernel: the message names the fusion and the kernel's
    source file, with NVRTC's log."""


def candidates() -> list[str]:
    """Places libnvrtc may be, most likely first."""
    env = os.environ.get(ENV_PATH)
    if env:
        return [env]
    pats = []
    for p in sys.path:
        if not p or not os.path.isdir(p):
            continue
        pats += [os.path.join(p, "nvidia", "cu13", "lib", "libnvrtc.so*"),
                 os.path.join(p, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*"),
                 os.path.join(p, "torch", "lib", "libnvrtc*.so*")]
    pats += ["/usr/local/cuda/lib64/libnvrtc.so*", "/usr/local/cuda-*/lib64/libnvrtc.so*",
             "/usr/lib/x86_64-linux-gnu/libnvrtc.so*"]
    out: list[str] = []
    for pat in pats:
        out += sorted(h for h in glob.glob(pat)
                      if "builtins" not in os.path.basename(h) and ".alt." not in h)
    return out


class Nvrtc:
    """One loaded libnvrtc."""

    def __init__(self, path: str):
        c = ctypes
        self.path = path
        # NVRTC opens libnvrtc-builtins by its soname at the first compile; where that
        # folder is not on the loader's path (a pip package), load it first from beside
        # libnvrtc, so the name resolves to the copy already loaded.
        for b in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*"))):
            if ".alt." not in b:
                try:
                    c.CDLL(b, mode=c.RTLD_GLOBAL)
                except OSError:
                    pass
        self.lib = lib = c.CDLL(path)
        vp, i, sz = c.c_void_p, c.c_int, c.c_size_t
        sig = {
            "nvrtcVersion": [c.POINTER(i), c.POINTER(i)],
            "nvrtcCreateProgram": [c.POINTER(vp), c.c_char_p, c.c_char_p, i, vp, vp],
            "nvrtcDestroyProgram": [c.POINTER(vp)],
            "nvrtcCompileProgram": [vp, i, c.POINTER(c.c_char_p)],
            "nvrtcGetProgramLogSize": [vp, c.POINTER(sz)],
            "nvrtcGetProgramLog": [vp, c.c_char_p],
            "nvrtcGetCUBINSize": [vp, c.POINTER(sz)],
            "nvrtcGetCUBIN": [vp, c.c_char_p],
            "nvrtcGetErrorString": [i],
        }
        for name, args in sig.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, i
        lib.nvrtcGetErrorString.restype = c.c_char_p
        major, minor = c.c_int(), c.c_int()
        self._ok(lib.nvrtcVersion(c.byref(major), c.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)

    def _ok(self, status: int, what: str) -> None:
        if status != 0:
            msg = self.lib.nvrtcGetErrorString(status) or b"?"
            raise CudaCodegenError(f"{what} failed: {msg.decode()} ({status})")

    def compile(self, source: str, name: str, arch: str,
                options: tuple[str, ...] = ()) -> tuple[bytes, str]:
        """(cubin, log) of ``source`` for ``sm_<arch>``; raises NvrtcCompileError (with
        NVRTC's log) where the source does not compile."""
        c = ctypes
        prog = c.c_void_p()
        self._ok(self.lib.nvrtcCreateProgram(c.byref(prog), source.encode(),
                                             f"{name}.cu".encode(), 0, None, None),
                 "nvrtcCreateProgram")
        try:
            # --minimal (NVRTC 12.4+): the front end leaves out texture, surface and
            # device-runtime declarations, which generated kernels never use; the cubins of
            # giou's and adam_step's kernels were byte for byte the same, each compile
            # 2.5-3 ms (5-9%) shorter (NVRTC 13.0, here).
            minimal = ("--minimal",) if self.version >= (12, 4) else ()
            opts = [f"--gpu-architecture=sm_{arch}", "-default-device", "-std=c++17",
                    *minimal, *options]
            arr = (c.c_char_p * len(opts))(*[o.encode() for o in opts])
            status = self.lib.nvrtcCompileProgram(prog, len(opts), arr)
            n = c.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, c.byref(n))
            buf = c.create_string_buffer(max(n.value, 1))
            self.lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode(errors="replace")
            if status != 0:
                raise NvrtcCompileError(log.strip() or f"status {status}")
            self._ok(self.lib.nvrtcGetCUBINSize(prog, c.byref(n)), "nvrtcGetCUBINSize")
            cubin = c.create_string_buffer(n.value)
            self._ok(self.lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
            return cubin.raw, log
        finally:
            self.lib.nvrtcDestroyProgram(c.byref(prog))


_LOCK = threading.Lock()
_NVRTC: Optional[Nvrtc] = None
_WHY_NOT: Optional[str] = None


def load() -> Nvrtc:
    """The process's libnvrtc; raises CudaCodegenError saying where it looked."""
    global _NVRTC, _WHY_NOT
    with _LOCK:
        if _NVRTC is not None:
            return _NVRTC
        if _WHY_NOT is not None:
            raise CudaCodegenError(_WHY_NOT)
        tried = candidates()
        errors = []
        for path in tried:
            try:
                _NVRTC = Nvrtc(path)
                return _NVRTC
            except (OSError, AttributeError, CudaCodegenError) as e:
                errors.append(f"{path}: {e}")
        _WHY_NOT = ("NVRTC cannot be loaded: " + ("; ".join(errors) if errors else
                    f"no libnvrtc found (set {ENV_PATH}, or install the nvidia NVRTC package)"))
        raise CudaCodegenError(_WHY_NOT)


def unavailable() -> str:
    """"" where NVRTC loads, else why not."""
    try:
        load()
        return ""
    except CudaCodegenError as e:
        return str(e)


# --- the cubin cache ---------------------------------------------------------------------------
def cubin_path(source: str, arch: str, version: tuple[int, int]) -> Path:
    key = content_key(source, f"nvrtc-{version[0]}.{version[1]}", f"sm_{arch}")[:24]
    return cache_root() / "cuda_c" / f"{key}.cubin"


def _read_cubin(path: Path) -> Optional[bytes]:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(_MAGIC) + 32
    if len(data) < head or not data.startswith(_MAGIC):
        return None
    digest, body = data[len(_MAGIC):head], data[head:]
    return body if hashlib.sha256(body).digest() == digest else None


def _write_cubin(path: Path, cubin: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + hashlib.sha256(cubin).digest() + cubin)
        os.replace(tmp, path)
    except OSError:
        pass            # an unwritable cache costs a compile next time, nothing else


# What this process compiled (benchmarks/compile_time.py reports it).
STATS: dict = {"compiled": 0, "cached": 0, "compile_s": 0.0, "max_s": 0.0}


def cubin_for(source: str, name: str, arch: str, what: str = "") -> bytes:
    """The cubin of ``source`` for ``sm_<arch>``: from the disk cache, or compiled (and
    cached). The source is compiled without its comments (``compile_text``: fusions that
    differ in HLO names only share a cubin). ``what``: the fusion and source path, for
    NvrtcCompileError's message."""
    source = compile_text(source)
    nv = load()
    path = cubin_path(source, arch, nv.version)
    cubin = _read_cubin(path)
    if cubin is not None:
        STATS["cached"] += 1
        return cubin
    t0 = time.perf_counter()
    try:
        cubin, _ = nv.compile(source, name, arch)
    except NvrtcCompileError as e:
        raise NvrtcCompileError(f"NVRTC could not compile kernel {name}{what}:\n{e}") from None
    dt = time.perf_counter() - t0
    STATS["compiled"] += 1
    STATS["compile_s"] += dt
    STATS["max_s"] = max(STATS["max_s"], dt)
    _write_cubin(path, cubin)
    return cubin


_POOL: Optional[ThreadPoolExecutor] = None
_FUTURES: dict[tuple[str, str], "Future[bytes]"] = {}


def compile_async(source: str, name: str, arch: str, what: str = "") -> "Future[bytes]":
    """``cubin_for`` in the process's compile threads (one per core, at most 16)."""
    global _POOL
    key = (compile_text(source), arch)
    with _LOCK:
        fut = _FUTURES.get(key)
        if fut is not None and not (fut.done() and fut.exception() is not None):
            return fut            # the same code asked for again: one compile
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=max(1, min(16, os.cpu_count() or 1)),
                                       thread_name_prefix="hlotk-nvrtc")
        fut = _FUTURES[key] = _POOL.submit(cubin_for, source, name, arch, what)
    return fut


_WARM_SOURCE = 'extern "C" __global__ void hlotk_nvrtc_warm_up(float* x) { x[threadIdx.x] = 0.0f; }\n'


def warm_up(arch: str) -> None:
    """Load NVRTC and compile a tiny kernel (nothing cached): the process's first compile
    pays NVRTC's start-up, ahead of the first real kernel (runtime/cuda/prewarm.py)."""
    load().compile(_WARM_SOURCE, "hlotk_nvrtc_warm_up", arch)

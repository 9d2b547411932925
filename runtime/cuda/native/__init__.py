"""The native launcher: a compiled CUDA executable called at JAX's own dispatch speed.

The Python path of the CUDA backend (``CudaExecutable.run``) costs ~90 µs of host time per
call on the H200 host plus ~30-45 µs per argument or result (DLPack exports, PJRT imports,
torch ops from Python: benchmarks/host_overhead.md). Here the whole executable is ONE
CUDA graph, launched by an XLA FFI custom call (``graph_launch.cc``) inside a ``jax.jit``
of a tiny wrapper, so that JAX's C++ dispatch flattens the pytrees, checks the arguments,
allocates the results (fresh ``jax.Array``s, donation through ``input_output_aliases``)
and hands the handler raw device pointers on XLA's stream. The handler writes the pointers
that moved since the last call into the graph's kernel parameters at the places found by
diffing four captures (``patch.py``) and calls ``cuGraphLaunch``. After the first call of a
signature, a call is JAX's dispatch plus a few µs of C++; no Python runs per buffer.

Which executables: those whose every thunk can be captured (no host-driven loops or
branches, no host fallbacks), with plain row-major arrays in and out, on a GPU that JAX
also sees (``launcher.eligibility``). The others keep the Python path; ``exe.report()``
says which path an executable takes and why.

Building: ``graph_launch.cc`` needs a C++17 compiler and the XLA FFI headers jaxlib ships
(``jax.ffi.include_dir()``); the CUDA driver is loaded at run time. It is compiled once per machine
into the machine cache (``$HLOTK_MACHINE_CACHE_DIR/native/``, default
``~/.cache/hlotk-machine/native``; keyed by the source, the headers, the compiler and its
flags, the CUDA driver version), not per ``HLOTK_CACHE_DIR``, in the background from
``import runtime`` on a machine with an NVIDIA GPU (``runtime/cuda/prewarm.py``);
``python -m runtime.cuda.native`` builds it ahead of time and prints where, or why it
cannot. Without a compiler everything still works on the Python
path.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional

from ..errors import NativeLauncherError, NativeLauncherWarning

SOURCE = Path(__file__).with_name("graph_launch.cc")
TARGET = "hlotk_graph_launch"         # the FFI target on CUDA
# The same argument mapping and patching without launching (tests; the floor of an FFI call)
DRY_RUN_TARGET = "hlotk_graph_dry_run"
_COMPILERS = ("c++", "g++", "clang++")


def compiler() -> Optional[str]:
    """The C++ compiler to build with: ``$CXX``, else the first of c++, g++, clang++."""
    env = os.environ.get("CXX")
    if env:
        return shutil.which(env) or env
    for name in _COMPILERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def cuda_driver_version() -> str:
    """The CUDA driver's version (``cuDriverGetVersion``, no context needed), or "none"."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        return str(v.value) if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 else "none"
    except (OSError, AttributeError):
        return "none"


def _compiler_id(cxx: str) -> str:
    """The compiler binary as a file: its real path, size and modification time (a
    compiler upgrade changes them; no ``--version`` subprocess on the warm path)."""
    real = os.path.realpath(shutil.which(cxx) or cxx)
    try:
        st = os.stat(real)
        return f"{real}\0{st.st_size}\0{st.st_mtime_ns}"
    except OSError:
        return real


def _build_key(cxx: str, include: str, flags: list[str]) -> str:
    """What the library depends on: the source, the XLA FFI headers it includes, the
    compiler and its flags, the CUDA driver version (the driver is loaded at run time, so
    the build does not read it; keyed anyway so that a driver upgrade starts clean)."""
    h = hashlib.sha256()
    h.update(SOURCE.read_bytes())
    for header in ("api.h", "ffi.h", "c_api.h"):
        p = Path(include, "xla", "ffi", "api", header)
        h.update(p.read_bytes() if p.exists() else b"-")
    for part in (cxx, _compiler_id(cxx), " ".join(flags), cuda_driver_version()):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:20]


_FLAGS = ["-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden"]


def library_dir(cache_dir: Optional[Path] = None) -> Path:
    """Where the built library lives: ``cache_dir/native`` if given, else the machine
    cache (``codegen.cache.machine_cache_root()/native``), shared by every
    ``HLOTK_CACHE_DIR``: it depends on this machine's compiler and jaxlib, not on a program."""
    from codegen.cache import machine_cache_root
    return Path(cache_dir) / "native" if cache_dir is not None else machine_cache_root() / "native"


def build(cache_dir: Optional[Path] = None) -> Path:
    """Compile ``graph_launch.cc`` (once; later calls find the cached library). Raises
    NativeLauncherError naming the compiler and its output when it cannot."""
    import jax.ffi
    cxx = compiler()
    if cxx is None:
        raise NativeLauncherError("no C++ compiler found (set CXX, or install g++ or clang++) "
                                  f"to build {SOURCE.name}")
    include = jax.ffi.include_dir()
    out_dir = library_dir(cache_dir)
    path = out_dir / f"graph_launch_{_build_key(cxx, include, _FLAGS)}.so"
    if path.exists():
        return path
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NativeLauncherError(f"cannot create {out_dir} for the native launcher: {e}") from None
    # One build at a time on this machine (processes of a test run, the background build
    # started at import): the others wait and then find the library.
    with _build_lock(out_dir):
        if not path.exists():
            _compile(cxx, include, out_dir, path)
    return path


@contextlib.contextmanager
def _build_lock(out_dir: Path) -> Iterator[None]:
    try:
        f = open(out_dir / ".build.lock", "w")
    except OSError:             # a read-only cache: build without the lock
        yield
        return
    try:
        import fcntl
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
    finally:
        f.close()               # releases the lock


def _compile(cxx: str, include: str, out_dir: Path, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=path.stem, suffix=".tmp.so")
    os.close(fd)
    cmd = [cxx, *_FLAGS, "-isystem", include, str(SOURCE), "-o", tmp, "-ldl"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-20:])
            raise NativeLauncherError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
        os.replace(tmp, path)     # atomic: a reader never sees half a library
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NativeLauncherError(f"running {cxx} to build {SOURCE.name} failed: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load(path: Path) -> Any:
    """``ctypes.CDLL(path)``; a library that does not load (a damaged file in the cache) is
    reported, removed and built again once."""
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        warnings.warn(f"hlotk: the cached native launcher {path} does not load ({e}); "
                      "building it again", NativeLauncherWarning, stacklevel=3)
        try:
            path.unlink()
        except OSError:
            pass
        return ctypes.CDLL(str(build()))


_ERRBUF = 1024
_LIB: Any = None
_LIB_ERROR: Optional[str] = None


def library() -> Any:
    """The loaded launcher library (ctypes), built if needed and registered with JAX's FFI.
    Raises NativeLauncherError (and remembers why, so a failure costs one attempt)."""
    global _LIB, _LIB_ERROR
    if _LIB is not None:
        return _LIB
    if _LIB_ERROR is not None:
        raise NativeLauncherError(_LIB_ERROR)
    try:
        lib = _load(build())
        _declare(lib)
        import jax.ffi
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.hk_ffi_graph_launch),
                                    platform="CUDA")
        for platform in ("cpu", "CUDA"):
            jax.ffi.register_ffi_target(DRY_RUN_TARGET, jax.ffi.pycapsule(lib.hk_ffi_dry_run),
                                        platform=platform)
    except NativeLauncherError as e:
        _LIB_ERROR = str(e)
        raise
    except Exception as e:  # noqa: BLE001  (loading or registering: say so, once)
        _LIB_ERROR = f"loading the native launcher failed: {type(e).__name__}: {e}"
        raise NativeLauncherError(_LIB_ERROR) from None
    _LIB = lib
    return lib


_DRIVER_ERROR: Optional[str] = None
_DRIVER_OK = False


def driver_library() -> Any:
    """``library()`` with the CUDA driver loaded (``hk_init``); raises NativeLauncherError."""
    global _DRIVER_ERROR, _DRIVER_OK
    lib = library()
    if _DRIVER_OK:
        return lib
    if _DRIVER_ERROR is None:
        err = ctypes.create_string_buffer(_ERRBUF)
        if lib.hk_init(err, _ERRBUF) != 0:
            _DRIVER_ERROR = err.value.decode(errors="replace")
        else:
            _DRIVER_OK = True
            return lib
    raise NativeLauncherError(_DRIVER_ERROR)


_WARNED: set[str] = set()


def warn_fallback(message: str, key: Optional[str] = None) -> None:
    """Warn that calls take the Python path, and why: once per process for a ``key``, else
    every time (callers warn once per executable or callable already)."""
    if key is None or key not in _WARNED:
        if key is not None:
            _WARNED.add(key)
        warnings.warn(f"hlotk: {message}; calls take the Python path (same results, more "
                      "host time per call)", NativeLauncherWarning, stacklevel=3)


def check(status: int, err: Any, what: str) -> None:
    """Raise NativeLauncherError with the library's message when ``status`` is negative."""
    if status < 0:
        raise NativeLauncherError(f"{what}: {err.value.decode(errors='replace')}")


def _declare(lib: Any) -> None:
    c = ctypes
    i32p, i64p, u64p = c.POINTER(c.c_int32), c.POINTER(c.c_int64), c.POINTER(c.c_uint64)
    sig = {
        "hk_version": (c.c_int, []),
        "hk_init": (c.c_int, [c.c_char_p, c.c_size_t]),
        "hk_graph_describe": (c.c_int, [c.c_uint64, c.c_void_p, u64p, c.c_char_p, c.c_size_t]),
        "hk_exec_create": (c.c_int64, [c.c_uint64, c.c_int32, c.c_int32, c.c_int32, c.c_int32,
                                       i32p, c.c_int32, i32p, i64p, i32p, i64p, c.c_char_p,
                                       c.c_size_t]),
        "hk_exec_create_dry": (c.c_int64, [c.c_int32, i32p, c.POINTER(c.c_void_p), u64p,
                                           c.c_int32, c.c_int32, c.c_int32, i32p, c.c_int32,
                                           i32p, i64p, i32p, i64p, c.c_char_p, c.c_size_t]),
        "hk_exec_launch": (c.c_int, [c.c_int64, u64p, c.c_int32, c.c_uint64, c.c_char_p,
                                     c.c_size_t]),
        "hk_exec_blob": (c.c_int, [c.c_int64, c.c_int32, c.c_void_p, u64p]),
        "hk_exec_stats": (c.c_int, [c.c_int64, u64p]),
        "hk_exec_destroy": (None, [c.c_int64]),
        "hk_graph_lower_copies": (c.c_int, [c.c_uint64, c.c_int32, u64p, u64p, c.c_char_p,
                                            c.c_size_t]),
        "hk_cuda_allocations": (c.c_int, [u64p, c.c_int32, u64p]),
        "hk_exec_add_slots": (c.c_int, [c.c_int64, c.c_uint64, c.c_int32, c.c_char_p,
                                        c.c_size_t]),
        "hk_trace_base": (c.c_int, [c.c_uint64]),
        "hk_exec_trace": (c.c_int, [c.c_int64, c.c_int]),
        "hk_exec_trace_read": (c.c_int, [c.c_int64, u64p, c.POINTER(c.c_float)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def int_array(values: Any, ctype: Any) -> Any:
    values = list(values)
    return (ctype * max(len(values), 1))(*values)

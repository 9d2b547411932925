"""Triton's installation key without its 0.3 s hash: ``triton_key()`` remembered on disk.

Every entry of Triton's on-disk cache is keyed by ``triton_key()``: Triton's version and a
sha256 over its compiler, backend and language sources and its ~400-500 MB ``libtriton``
library, computed once per process (~0.3 s on the H200 host, 0.7 s here). A warm process
(every kernel already in Triton's cache) paid that before its first launch.

Here the key is stored under the machine cache (``codegen.cache.machine_cache_root()``),
indexed by a *fingerprint* of the installation: Triton's version, its package directory, and
the path, size, modification time and inode of every ``.py`` and ``.so`` file under it (a
superset of what ``triton_key()`` reads; ~2 ms of ``stat``). Reinstalling, upgrading or
editing Triton changes the fingerprint, so the key is computed again; the stored key is
never used for another installation. An entry that fails its checksum is reported
(``CacheWarning``) and recomputed.

``install()`` makes Triton use the stored key (it replaces the module attribute its cache
key function reads, as Triton's own warm-up pool does in its workers); compile workers get
it through ``ENV`` so they skip the hash too.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

from codegen.cache import CacheWarning, machine_cache_root

from .compile_worker import TRITON_KEY_MODULES as _MODULES

ENV = "HLOTK_TRITON_KEY"          # the key, for compile workers (set by the parent)
# Modules whose global ``triton_key`` computes a cache key (where this Triton has one):
# _MODULES, shared with the compile workers.
_lock = threading.Lock()
_ORIGINAL: Optional[Callable[[], str]] = None
_VALUE: Optional[str] = None
# What happened in this process (benchmarks/compile_time.py reports it): "disk" (read),
# "computed" (hashed and stored), "" (not yet).
STATS: dict[str, Any] = {"source": "", "seconds": 0.0}


def triton_root() -> str:
    import triton
    return os.path.dirname(os.path.abspath(triton.__file__))


def fingerprint(root: Optional[str] = None) -> str:
    """A digest of Triton's version and of every .py/.so file's path, size, mtime and inode
    under its package directory (changes whenever any file ``triton_key()`` hashes could)."""
    import triton
    root = root or triton_root()
    h = hashlib.sha256(f"{triton.__version__}\0{root}\n".encode())
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()                  # a stable walk order
        for name in sorted(filenames):
            if not name.endswith((".py", ".so")):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            rel = os.path.relpath(path, root)
            h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    return h.hexdigest()


_FP: Optional[str] = None


def current_fingerprint() -> str:
    """``fingerprint()`` of the imported Triton, computed once per process."""
    global _FP
    if _FP is None:
        _FP = fingerprint()
    return _FP


def entry_path(fp: str) -> Path:
    return machine_cache_root() / "triton_key" / f"{fp[:40]}.json"


def _check(fp: str, key: str) -> str:
    return hashlib.sha256(f"{fp}\0{key}".encode()).hexdigest()


def load(fp: str) -> Optional[str]:
    """The stored key for fingerprint ``fp``; None when there is none. A damaged entry
    (unreadable, bad JSON, wrong checksum or fingerprint) warns and gives None."""
    path = entry_path(fp)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        warnings.warn(f"hlotk: cannot read Triton's stored key {path} ({e}); computing it "
                      "again", CacheWarning, stacklevel=2)
        return None
    try:
        data = json.loads(text)
        key, stored_fp, check = data["key"], data["fingerprint"], data["sha256"]
        ok = isinstance(key, str) and stored_fp == fp and check == _check(fp, key)
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        warnings.warn(f"hlotk: Triton's stored key {path} is corrupt (checksum or "
                      "fingerprint mismatch); computing it again", CacheWarning, stacklevel=2)
        return None
    return key


def store(fp: str, key: str) -> None:
    """Write the entry atomically (a reader never sees half of it); best effort."""
    path = entry_path(fp)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"fingerprint": fp, "key": key, "sha256": _check(fp, key)}, f)
        os.chmod(tmp, 0o644)         # a machine cache: other users' processes read it
        os.replace(tmp, path)
    except OSError as e:
        warnings.warn(f"hlotk: cannot store Triton's key in {path}: {e}", CacheWarning,
                      stacklevel=2)


def original() -> Callable[[], str]:
    """Triton's own ``triton_key`` (the hashing one), even after ``install``."""
    global _ORIGINAL
    if _ORIGINAL is None:
        import importlib
        for name in _MODULES[:2]:          # where Triton versions define it
            fn = getattr(importlib.import_module(name), "triton_key", None)
            if fn is not None:
                _ORIGINAL = getattr(fn, "_hlotk_original", fn)
                break
        else:
            raise ImportError("this Triton has no triton_key() to remember")
    return _ORIGINAL


def _patch(value: str) -> None:
    from .compile_worker import patch_triton_key
    original()
    stand_in = patch_triton_key(value)
    stand_in._hlotk_original = _ORIGINAL          # type: ignore[attr-defined]
    stand_in.cache_clear = lambda: None           # type: ignore[attr-defined]


def install(compute: bool = True) -> Optional[str]:
    """Make Triton use the stored key; returns it. Without a stored one: compute it with
    Triton's own function and store it (``compute``), or return None (the cheap check a
    caller makes before starting that work in the background)."""
    global _VALUE
    if _VALUE is not None:
        return _VALUE
    import time
    t0 = time.perf_counter()
    with _lock:
        if _VALUE is not None:
            return _VALUE
        fp = current_fingerprint()
        key = load(fp)
        source = "disk"
        if key is None:
            if not compute:
                return None
            key = original()()
            store(fp, key)
            source = "computed"
        _patch(key)
        _VALUE = key
        STATS.update(source=source, seconds=time.perf_counter() - t0)
        return key


def worker_env(env: dict) -> dict:
    """``env`` for a compile worker, with the key where this process knows it already."""
    if _VALUE is not None:
        env = dict(env)
        env[ENV] = _VALUE
    return env


def reset_for_tests() -> None:
    """Undo ``install`` in this process (tests)."""
    global _VALUE, _FP
    _FP = None
    with _lock:
        if _ORIGINAL is not None:
            import sys
            for name in _MODULES:
                mod = sys.modules.get(name)
                if mod is not None and hasattr(mod, "triton_key"):
                    mod.triton_key = _ORIGINAL
        _VALUE = None
        STATS.update(source="", seconds=0.0)

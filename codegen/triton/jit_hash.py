"""Triton's per-function cache key for hlotk's generated kernels, remembered on disk.

Before a launch can look its binary up in Triton's cache, Triton computes the function's
``cache_key``: it parses the function's source (``ast.parse``) and walks what it calls,
~6 ms per kernel on the H200 host, every process: ~0.1 s of a warm first call with 17
kernels. A generated kernel file (``codegen/triton/kernel.py``) is self-contained (it
imports only ``triton`` and ``triton.language``; its helpers are in the same file), so that
key is a function of the file's bytes, the function's name, the Triton installation and the
Python version (its ``ast``). Those four key an entry here (``$HLOTK_CACHE_DIR/triton/
jit_hashes.json``); a warm process sets ``fn.hash`` from it before the first launch, which
Triton's ``cache_key`` returns as is. The value only names a cache entry: a key that no
longer matched would miss Triton's cache (and compile), it cannot pick another kernel's
binary, and any change of the file, Triton or Python gives another entry.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Optional

from codegen.cache import CacheWarning, cache_root

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_lock = threading.Lock()
_TABLE: Optional[dict] = None
_NEW: dict[str, str] = {}
STATS = {"primed": 0, "recorded": 0}


def table_path() -> Path:
    return cache_root() / "triton" / "jit_hashes.json"


def entry_key(path: Path, name: str) -> Optional[str]:
    """The entry for function ``name`` of kernel file ``path``; None where Triton's
    installation cannot be fingerprinted."""
    try:
        from . import triton_key
        fp = triton_key.current_fingerprint()
        data = Path(path).read_bytes()
    except Exception:  # noqa: BLE001  (no entry: Triton computes its key)
        return None
    h = hashlib.sha256(data)
    h.update(f"\0{name}\0{fp}\0{sys.version}".encode())
    return h.hexdigest()


def _table() -> dict:
    global _TABLE
    if _TABLE is None:
        path = table_path()
        try:
            table = json.loads(path.read_text())
            if not isinstance(table, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            table = {}
        except (OSError, ValueError) as e:
            warnings.warn(f"hlotk: {path} is unreadable ({e}); Triton computes its kernels' "
                          "keys again", CacheWarning, stacklevel=3)
            table = {}
        _TABLE = table
    return _TABLE


def prime(fn: Any, path: Path, name: str) -> bool:
    """Set ``fn.hash`` from the table where it has an entry (and Triton has not computed
    it yet). True if it did."""
    if getattr(fn, "hash", "absent") is not None:   # computed, or another Triton's JIT
        return False
    key = entry_key(path, name)
    if key is None:
        return False
    with _lock:
        value = _table().get(key)
    if not (isinstance(value, str) and _HEX64.match(value)):
        return False
    fn.hash = value
    STATS["primed"] += 1
    return True


def record(fn: Any, path: Path, name: str) -> None:
    """After a launch: remember the key Triton computed for ``fn`` (written at exit)."""
    value = getattr(fn, "hash", None)
    if not (isinstance(value, str) and _HEX64.match(value)):
        return
    key = entry_key(path, name)
    if key is None:
        return
    with _lock:
        if _table().get(key) == value:
            return
        _table()[key] = value
        _NEW[key] = value
        STATS["recorded"] += 1
        if len(_NEW) == 1:
            atexit.register(flush)


def flush() -> None:
    """Write the new entries (merged with what other processes wrote meanwhile)."""
    with _lock:
        if not _NEW:
            return
        path = table_path()
        try:
            table = json.loads(path.read_text())
            table = table if isinstance(table, dict) else {}
        except (OSError, ValueError):
            table = {}
        table.update(_NEW)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(table, f)
            os.replace(tmp, path)
            _NEW.clear()
        except OSError:
            pass


def reset_for_tests() -> None:
    global _TABLE
    with _lock:
        _TABLE = None
        _NEW.clear()

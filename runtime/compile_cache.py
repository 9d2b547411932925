"""The on-disk cache of optimized modules: a new process compiling a module it has compiled
before skips the passes (JAX's persistent compilation cache, for hlotk's pipeline).

Key: the input module's full HLO text (constants and metadata included), the pass spec,
the backend and a hash of hlotk's own ``hlo/`` and ``passes/`` sources, so a changed pass
never reads an old result. Value: the optimized module, pickled (parsing HLO text back
costs as much as the passes on a big module), stored only when the unpickled copy prints
the same HLO text (``hlo.same.prints_same``: compared field by field, not printed), with
whether the input was verified. ``$HLOTK_CACHE_DIR/modules/
<key>.pickle``; ``HLOTK_COMPILE_CACHE=0`` turns it off (and ``imported``: modules imported
from JAX, by their StableHLO bytecode, in ``imports/``). A hit gives the pass records and
the fusion report (``report_for``) of the run that produced the module, so
``exe.report()``, the viewer and the tests that read the report see the same thing warm
as cold.
"""
from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from typing import Callable, Optional

import hlo
from codegen.cache import cache_root, content_key
from hlo.same import prints_same
from passes.fusion.explain import attach, report_for

from . import deferred

_SOURCE_HASH: Optional[str] = None


def enabled() -> bool:
    return os.environ.get("HLOTK_COMPILE_CACHE", "1").strip().lower() not in ("0", "off", "false")


def source_hash() -> str:
    """A hash of every .py file of hlo/ and passes/ (what decides a compiled module)."""
    global _SOURCE_HASH
    if _SOURCE_HASH is None:
        root = Path(hlo.__file__).resolve().parent.parent
        h = hashlib.sha256()
        for pkg in ("hlo", "passes"):
            for path in sorted((root / pkg).rglob("*.py")) + sorted((root / pkg).rglob("*.json")):
                h.update(str(path.relative_to(root)).encode())
                h.update(path.read_bytes())
        _SOURCE_HASH = h.hexdigest()
    return _SOURCE_HASH


def _path(key: str) -> Path:
    return cache_root() / "modules" / f"{key}.pickle"


# A deep pickle: pickle walks an instruction's operands and users depth-first, one C-level
# recursion step per link, so a chain of a few hundred dependent instructions (an unrolled
# model, a long elementwise chain fused into one kernel) exceeds Python's recursion limit.
_DEEP_STACK_BYTES = 512 << 20
_LEVELS_PER_INSTRUCTION = 16


def _dumps(obj: object, instructions: int) -> bytes:
    """``pickle.dumps(obj)``; where that recurses too deeply, again in a thread whose stack
    holds ``instructions`` links (a raised recursion limit on the default stack could
    overflow the C stack instead of raising)."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except RecursionError:
        pass
    import sys
    import threading
    out: dict[str, object] = {}

    def work() -> None:
        try:
            out["data"] = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as e:  # noqa: BLE001  (re-raised in the caller's thread)
            out["error"] = e
    limit = sys.getrecursionlimit()
    old_stack = threading.stack_size(_DEEP_STACK_BYTES)
    sys.setrecursionlimit(max(limit, 10_000 + _LEVELS_PER_INSTRUCTION * instructions))
    try:
        t = threading.Thread(target=work, name="hlotk-deep-pickle")
        t.start()
        t.join()
    finally:
        threading.stack_size(old_stack)
        sys.setrecursionlimit(limit)
    if "error" in out:
        raise out["error"]      # type: ignore[misc]
    return out["data"]          # type: ignore[return-value]


def _instruction_count(module: hlo.Module) -> int:
    return sum(len(c.instructions) for c in module.computations)


def compiled(module: hlo.Module, spec: str, backend: str,
             run: Callable[[hlo.Module], list],
             check: Optional[Callable[[hlo.Module], None]] = None,
             defer: bool = False) -> tuple[hlo.Module, list, bool]:
    """A copy of ``module`` after ``run`` (the passes, in place), from the cache when it
    holds it. Returns (module, pass records, hit). ``module`` itself is not modified.
    ``check`` (the verifier) runs on ``module`` before ``run``, and on a hit only if the
    entry was stored without it: an entry stored after a check vouches for its input text,
    which the key holds, checked by the same hlo/ sources (issue 13: the verifier was ~15%
    of a warm compile). ``defer``: a new entry is pickled now and checked and written at
    the next ``deferred.drain()`` (the CUDA backend's first call, while it waits for its
    kernels)."""
    if not enabled():
        if check is not None:
            check(module)
        copy = module.copy()
        return copy, run(copy), False
    try:
        text = module.to_text()
    except Exception:
        if check is not None:
            check(module)          # a module too broken to print: the verifier says why
        raise
    key = content_key(text, spec, backend, source_hash())[:32]
    path = _path(key)
    deferred.drain(path)        # this entry, if this process made it and has not written it
    try:
        data = path.read_bytes()
    except OSError:
        data = None
    if data is not None:
        try:
            entry = pickle.loads(data)
            cached, records, report = entry[:3]
            checked = len(entry) > 3 and entry[3] is True
            if isinstance(cached, hlo.Module):
                if check is not None and not checked:
                    check(module)
                if report is not None:
                    attach(cached, report)
                return cached, records, True
        except hlo.HlotkError:
            raise                   # the check's verdict on the input: not a cache problem
        except Exception:  # noqa: BLE001  (a damaged or stale entry: compile again)
            pass
    if check is not None:
        check(module)
    copy = module.copy()
    records = run(copy)
    try:
        # Pickled (parsing the text back costs as much as the passes on a big module);
        # stored only if the copy prints exactly as the module does.
        data = _dumps((copy, records, report_for(copy), check is not None),
                      _instruction_count(copy))
    except Exception:  # noqa: BLE001  (an unpicklable attribute: just not cached)
        return copy, records, False
    _checked_store(path, data, copy, lambda entry: entry[0], defer)
    return copy, records, False


def _checked_store(path: Path, data: bytes, original: hlo.Module,
                   module_of: Callable[[object], object], defer: bool) -> None:
    """Store ``data`` at ``path`` if the module it unpickles to prints the same as
    ``original`` (now, or at the next ``deferred.drain()``). Deferred, ``original`` may have
    changed meanwhile (a user editing ``lowered.module``): then the check fails and
    nothing is stored, as for any mismatch."""
    def store() -> None:
        try:
            if prints_same(module_of(pickle.loads(data)), original):
                _store(path, data)
        except Exception:  # noqa: BLE001  (unpicklable or unwritable: just not cached)
            pass
    if defer:
        deferred.defer(store, key=path)
    else:
        store()


# --- imported modules ------------------------------------------------------------------------
def _jax_versions() -> str:
    try:
        import jax
        import jaxlib
        return f"jax {jax.__version__} jaxlib {jaxlib.__version__}"
    except Exception:  # noqa: BLE001
        return "jax ?"


def imported(exported: object, defer: bool = False) -> hlo.Module:
    """``hlo.stablehlo.from_exported(exported)``, from the cache when it holds it (issue 13:
    MLIR's deserialization and the import were ~20% of a warm first call's CPU work on the
    Adam step). Key: the exported StableHLO bytecode, its function name, the jax/jaxlib
    versions (MLIR's reader) and hlo/ + passes/ sources (the importer). Stored pickled,
    only when the unpickled copy prints the same HLO text (``prints_same``); each hit is
    a fresh module. ``defer``: as ``compiled``'s."""
    from hlo.stablehlo import from_exported
    if not enabled():
        return from_exported(exported)
    try:
        bytecode = bytes(exported.mlir_module_serialized)     # type: ignore[attr-defined]
        name = str(getattr(exported, "fun_name", ""))
    except Exception:  # noqa: BLE001  (not an Exported: the importer says so)
        return from_exported(exported)
    h = hashlib.sha256(bytecode).hexdigest()
    key = content_key("import", h, name, _jax_versions(), source_hash())[:32]
    path = cache_root() / "imports" / f"{key}.pickle"
    deferred.drain(path)
    try:
        cached = pickle.loads(path.read_bytes())
        if isinstance(cached, hlo.Module):
            return cached
    except Exception:  # noqa: BLE001  (no entry, or a damaged one: import again)
        pass
    module = from_exported(exported)
    try:
        data = _dumps(module, _instruction_count(module))
    except Exception:  # noqa: BLE001  (unpicklable: just not cached)
        return module
    _checked_store(path, data, module, lambda entry: entry, defer)
    return module


def _store(path: Path, data: bytes) -> None:
    """Write an entry through a temporary file and a rename (no partial entry, no stray
    temporary file on a failure)."""
    from .atomic import atomic_write
    atomic_write(path, data)

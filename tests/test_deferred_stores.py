"""Deferred cache stores (runtime/deferred.py): on the CUDA backend a cold compile pickles
its cache entries at once and checks and writes them while the first call waits for its
kernels. Nothing may be lost or stale: the entry is written at ``drain()``, a lookup of
that entry in the same process writes it first, a module changed before the drain is not
stored, and the warm compile equals the cold one."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo
from runtime import compile_cache, deferred
from passes.pipelines import pipeline_spec
from runtime.tools import compile_module


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("HLOTK_COMPILE_CACHE", raising=False)
    deferred.drain()                      # nothing of another test's
    yield tmp_path
    deferred.drain()


def _program(x, w):
    return jax.nn.relu(x @ w).sum(axis=0) * 2.0


def _module() -> hlo.Module:
    x = np.ones((8, 16), np.float32)
    w = np.ones((16, 4), np.float32)
    return hlo.from_jax(_program, x, w)


SPEC = pipeline_spec("default", "cpu")


def _run(m: hlo.Module) -> list:
    return compile_module(m, SPEC, backend="cpu")[0]


def _entries(root) -> list:
    return sorted((root / "modules").glob("*.pickle")) if (root / "modules").exists() else []


def test_store_waits_for_drain(cache_dir):
    m = _module()
    _, records, hit = compile_cache.compiled(m, SPEC, "cpu", _run, defer=True)
    assert not hit and records
    assert _entries(cache_dir) == []          # pickled, not yet checked nor written
    assert deferred.pending() == 1
    assert deferred.drain() == 1
    assert len(_entries(cache_dir)) == 1
    again, _, hit = compile_cache.compiled(_module(), SPEC, "cpu", _run)
    assert hit


def test_lookup_writes_its_own_pending_entry_first(cache_dir):
    cold, _, _ = compile_cache.compiled(_module(), SPEC, "cpu", _run, defer=True)
    # another module's pending store stays pending; this one's is written by the lookup
    other = hlo.from_jax(lambda x: jnp.exp(x) + 1.0, np.ones((4,), np.float32))
    compile_cache.compiled(other, SPEC, "cpu", _run, defer=True)
    assert deferred.pending() == 2
    warm, _, hit = compile_cache.compiled(_module(), SPEC, "cpu", _run)
    assert hit and deferred.pending() == 1
    assert warm.to_text() == cold.to_text()


def test_module_changed_before_drain_is_not_stored(cache_dir):
    compiled, _, _ = compile_cache.compiled(_module(), SPEC, "cpu", _run, defer=True)
    # the executable's module edited before the store ran: the check fails, nothing written
    compiled.entry.root.name = "renamed_root"
    deferred.drain()
    assert _entries(cache_dir) == []


def test_without_defer_stores_at_once(cache_dir):
    compile_cache.compiled(_module(), SPEC, "cpu", _run)
    assert deferred.pending() == 0 and len(_entries(cache_dir)) == 1


def test_drain_runs_in_order_and_drops_failures():
    seen: list = []
    deferred.defer(lambda: seen.append(1), key="a")
    deferred.defer(lambda: 1 / 0, key="b")
    deferred.defer(lambda: seen.append(3), key="a")
    assert deferred.drain("a") == 2 and seen == [1, 3]
    assert deferred.drain() == 1 and deferred.pending() == 0


def test_imported_entry_deferred(cache_dir):
    from jax import export
    exp = export.export(jax.jit(_program))(np.ones((8, 16), np.float32),
                                           np.ones((16, 4), np.float32))
    first = compile_cache.imported(exp, defer=True)
    imports = cache_dir / "imports"
    assert not imports.exists() or not list(imports.glob("*.pickle"))
    second = compile_cache.imported(exp)          # its lookup writes the pending entry
    assert len(list(imports.glob("*.pickle"))) == 1
    assert second is not first and second.to_text() == first.to_text()

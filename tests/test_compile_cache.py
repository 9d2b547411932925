"""The on-disk cache of optimized modules (runtime/compile_cache.py): a warm compile gives
the same module, results, pass records and fusion report as a cold one; a damaged entry
is compiled again; HLOTK_COMPILE_CACHE=0 writes nothing."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo
import runtime
from passes.fusion.explain import report_for


def _program(x, w):
    h = jnp.tanh(x @ w)
    return jax.nn.softmax(h, axis=-1).sum(axis=0)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("HLOTK_COMPILE_CACHE", raising=False)
    return tmp_path


def _inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((16, 32), np.float32),
            rng.standard_normal((32, 8), np.float32))


def _compile(x, w):
    return runtime.client("cpu").compile(hlo.from_jax(_program, x, w))


def _run(exe, *args) -> np.ndarray:
    bufs = [exe.client.buffer_from_pyval(a) for a in args]
    return exe.execute(bufs)[0].to_numpy()


def test_warm_compile_equals_cold(cache_dir):
    x, w = _inputs()
    cold = _compile(x, w)
    assert not cold.module_cache_hit
    assert list((cache_dir / "modules").glob("*.pickle"))
    warm = _compile(x, w)
    assert warm.module_cache_hit
    assert warm.module.to_text() == cold.module.to_text()
    assert [r.name for r in warm.pass_records] == [r.name for r in cold.pass_records]
    want = np.asarray(jax.jit(_program)(x, w))
    for exe in (cold, warm):
        np.testing.assert_allclose(_run(exe, x, w), want, rtol=1e-5, atol=1e-6)
    # The fusion report survives the cache (exe.report, the viewer and explain read it).
    cold_report, warm_report = report_for(cold.module), report_for(warm.module)
    assert cold_report is not None and warm_report is not None
    assert warm_report.table() == cold_report.table()


def test_damaged_entry_is_compiled_again(cache_dir):
    x, w = _inputs()
    _compile(x, w)
    (entry,) = (cache_dir / "modules").glob("*.pickle")
    entry.write_bytes(b"not a pickle")
    again = _compile(x, w)
    assert not again.module_cache_hit
    np.testing.assert_allclose(_run(again, x, w),
                               np.asarray(jax.jit(_program)(x, w)), rtol=1e-5, atol=1e-6)


def test_cache_off_writes_nothing(cache_dir, monkeypatch):
    monkeypatch.setenv("HLOTK_COMPILE_CACHE", "0")
    x, w = _inputs()
    assert not _compile(x, w).module_cache_hit
    assert not _compile(x, w).module_cache_hit
    assert not (cache_dir / "modules").exists()


def test_verifier_runs_on_a_miss_and_on_unverified_entries_only(cache_dir, monkeypatch):
    from runtime import compile_cache
    x, w = _inputs()
    module = hlo.from_jax(_program, x, w)
    seen: list = []

    def check(m):
        seen.append(m)
        hlo.verify(m)

    def run(m):
        return []
    # a miss stored without a check, then a hit: the check runs (the entry vouches nothing)
    compile_cache.compiled(module, "dce", "cpu", run)
    _, _, hit = compile_cache.compiled(module, "dce", "cpu", run, check=check)
    assert hit and seen == [module]
    # an entry stored after a check (a verified compile): a hit skips it
    compile_cache.compiled(module, "cse", "cpu", run, check=check)
    assert len(seen) == 2
    _, _, hit = compile_cache.compiled(module, "cse", "cpu", run, check=check)
    assert hit and len(seen) == 2
    # the check's verdict on a bad input is raised, not taken for a damaged entry
    def refuse(m):
        raise hlo.VerifierError("refused by the test")
    with pytest.raises(hlo.VerifierError, match="refused by the test"):
        compile_cache.compiled(module, "dce", "cpu", run, check=refuse)


def test_client_compile_verifies_the_input_cold_and_not_warm(cache_dir, monkeypatch):
    x, w = _inputs()
    calls: list = []
    real = hlo.verify
    monkeypatch.setattr(hlo, "verify", lambda m, *a, **k: calls.append(m) or real(m, *a, **k))
    module = hlo.from_jax(_program, x, w)
    runtime.client("cpu").compile(module)
    cold_calls = [m for m in calls if m is module]
    assert cold_calls == [module]           # the input itself, once, before the passes
    calls.clear()
    warm = runtime.client("cpu").compile(module)
    assert warm.module_cache_hit and not [m for m in calls if m is module]
    calls.clear()
    runtime.client("cpu").compile(module, verify=False)   # no verification asked: none
    assert not [m for m in calls if m is module]


def test_unpickled_instructions_take_fresh_uids():
    # Passes and executables key tables by uid, unique within a process. A module written
    # by another process keeps that process's uids in its pickle; read here they could
    # equal uids handed out since (the CPU executable then looked up the wrong leaves:
    # KeyError (0,) in a `make test` run). Loading must give every instruction a new uid.
    import pickle
    x, w = _inputs()
    module = hlo.from_jax(_program, x, w)
    data = pickle.dumps(module)
    before = {i.uid for c in module.computations for i in c.instructions}
    loaded = pickle.loads(data)
    after = [i.uid for c in loaded.computations for i in c.instructions]
    assert len(set(after)) == len(after) and before.isdisjoint(after)
    fresh = hlo.from_jax(_program, x, w)          # made after the load: no clash either
    assert {i.uid for c in fresh.computations for i in c.instructions}.isdisjoint(after)
    assert loaded.to_text() == module.to_text()


def test_imported_modules_cached_by_bytecode(cache_dir, monkeypatch):
    from jax import export

    from hlo.stablehlo import importer
    from runtime import compile_cache
    x, w = _inputs()
    exp = export.export(jax.jit(_program))(x, w)
    calls: list = []
    real = importer.from_exported
    monkeypatch.setattr(importer, "from_exported", lambda e, **o: calls.append(e) or real(e))
    import hlo.stablehlo as stablehlo
    monkeypatch.setattr(stablehlo, "from_exported", importer.from_exported)
    cold = compile_cache.imported(exp)
    assert len(calls) == 1 and list((cache_dir / "imports").glob("*.pickle"))
    warm = compile_cache.imported(export.export(jax.jit(_program))(x, w))
    assert len(calls) == 1                      # the same bytecode: read, not imported
    assert warm is not cold and warm.to_text() == cold.to_text() == real(exp).to_text()
    # another program (other bytecode) is imported
    compile_cache.imported(export.export(jax.jit(_program))(x[:8], w))
    assert len(calls) == 2
    # runtime.jit lowers through it: the lowered module is the importer's, warm or cold
    got = runtime.jit(_program).lower(x, w).module.to_text()
    assert got.replace("jit__program", "") == cold.to_text().replace("jit__program", "")
    np.testing.assert_allclose(np.asarray(runtime.jit(_program)(x, w)),
                               np.asarray(jax.jit(_program)(x, w)), rtol=1e-5, atol=1e-6)


def test_imported_cache_off_and_damaged_entries(cache_dir, monkeypatch):
    from jax import export

    from runtime import compile_cache
    x, w = _inputs()
    exp = export.export(jax.jit(_program))(x, w)
    want = compile_cache.imported(exp).to_text()
    (entry,) = (cache_dir / "imports").glob("*.pickle")
    entry.write_bytes(b"not a pickle")
    assert compile_cache.imported(exp).to_text() == want      # imported again, rewritten
    assert compile_cache.imported(exp).to_text() == want
    monkeypatch.setenv("HLOTK_COMPILE_CACHE", "0")
    for e in (cache_dir / "imports").glob("*.pickle"):
        e.unlink()
    assert compile_cache.imported(exp).to_text() == want
    assert not list((cache_dir / "imports").glob("*.pickle"))


def _deep_chain(x):
    for _ in range(400):        # 1200 dependent instructions: deeper than pickle's recursion
        x = jnp.sin(x) * 1.01 + 0.5
    return x


def test_a_deep_operand_chain_is_cached_too(cache_dir):
    """Pickling follows operands and users depth-first: a chain of a few hundred dependent
    instructions exceeded the recursion limit and the entry was silently not stored (every
    compile of such a program was cold). It is stored now, and a hit runs the same."""
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    cold = runtime.client("cpu").compile(hlo.from_jax(_deep_chain, x))
    assert not cold.module_cache_hit
    assert list((cache_dir / "modules").glob("*.pickle"))
    warm = runtime.client("cpu").compile(hlo.from_jax(_deep_chain, x))
    assert warm.module_cache_hit
    assert warm.module.to_text() == cold.module.to_text()
    want = np.asarray(jax.jit(_deep_chain)(x))
    np.testing.assert_allclose(_run(warm, x), want, rtol=1e-5, atol=1e-5)


def test_a_first_call_traces_compiles_and_runs_under_the_raised_threshold(cache_dir,
                                                                          monkeypatch):
    """runtime.jit's first call (the tracing, the compile, the first run) and an explicit
    lower collect as a compile does; the second call is back at the caller's thresholds."""
    import gc

    from runtime.client import COMPILE_GEN0_THRESHOLD, LoadedExecutable
    old = gc.get_threshold()
    traced, ran = [], []
    real = LoadedExecutable.execute

    def execute(self, arguments):
        ran.append(gc.get_threshold())
        return real(self, arguments)
    monkeypatch.setattr(LoadedExecutable, "execute", execute)

    def f(x, w):
        traced.append(gc.get_threshold())
        return _program(x, w)
    try:
        gc.set_threshold(700, 10, 10)
        x, w = _inputs()
        g = runtime.jit(f)
        got = g(x, w)
        g(x, w)
        runtime.jit(f).lower(x, w)
        raised = (COMPILE_GEN0_THRESHOLD, 10, 10)
        assert traced == [raised, raised]
        assert ran == [raised, (700, 10, 10)]
        assert gc.get_threshold() == (700, 10, 10)
        np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(_program)(x, w)),
                                   rtol=1e-5, atol=1e-5)
    finally:
        gc.set_threshold(*old)


def test_a_compile_collects_cycles_less_often_and_restores_the_collector(cache_dir):
    import gc

    from runtime.client import COMPILE_GEN0_THRESHOLD, fewer_collections
    old = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        seen = []
        x, w = _inputs()
        c = runtime.client("cpu")
        real = c._backend.prepare

        def prepare(module, **kw):          # inside the compile: the raised threshold
            seen.append(gc.get_threshold())
            return real(module, **kw)
        c._backend.prepare = prepare
        c.compile(hlo.from_jax(_program, x, w))
        assert seen == [(COMPILE_GEN0_THRESHOLD, 10, 10)]
        assert gc.get_threshold() == (700, 10, 10)
        with pytest.raises(RuntimeError):       # restored when the compile fails too
            with fewer_collections():
                raise RuntimeError("a failing compile")
        assert gc.get_threshold() == (700, 10, 10)
        for kept in ((0, 10, 10), (100_000, 10, 10)):  # off, or already rarer: left alone
            gc.set_threshold(*kept)
            with fewer_collections():
                assert gc.get_threshold() == kept
    finally:
        gc.set_threshold(*old)

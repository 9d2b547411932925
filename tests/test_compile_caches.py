"""Issue 13's on-disk caches for a warm first call, without a GPU: Triton's installation
key (fingerprint, invalidation, corrupt entries), the native launcher's per-machine build
key, flash attention's remembered choice, and the flash candidates' pool jobs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from codegen.cache import CacheWarning, machine_cache_root

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _caches(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HLOTK_MACHINE_CACHE_DIR", str(tmp_path / "machine"))


@pytest.fixture
def tk():
    pytest.importorskip("triton")
    from codegen.triton import triton_key
    triton_key.reset_for_tests()
    yield triton_key
    triton_key.reset_for_tests()


def _fake_triton(root: Path) -> Path:
    (root / "compiler").mkdir(parents=True)
    (root / "compiler" / "compiler.py").write_text("x = 1\n")
    (root / "_C").mkdir()
    (root / "_C" / "libtriton.so").write_bytes(b"\0" * 64)
    (root / "README.txt").write_text("not hashed by triton_key\n")
    return root


# --- Triton's key ---------------------------------------------------------------------------
def test_fingerprint_changes_with_any_hashed_file_and_the_version(tmp_path, tk, monkeypatch):
    import triton
    root = _fake_triton(tmp_path / "triton")
    fp = tk.fingerprint(str(root))
    assert fp == tk.fingerprint(str(root))                       # stable
    (root / "README.txt").write_text("other\n")                  # not a .py/.so: same
    assert tk.fingerprint(str(root)) == fp
    src = root / "compiler" / "compiler.py"
    src.write_text("x = 22\n")                                   # edited source
    fp2 = tk.fingerprint(str(root))
    assert fp2 != fp
    os.utime(src, ns=(1, 1))                                     # touched only
    fp3 = tk.fingerprint(str(root))
    assert fp3 != fp2
    (root / "compiler" / "new.py").write_text("")                # a new module
    fp4 = tk.fingerprint(str(root))
    assert fp4 != fp3
    monkeypatch.setattr(triton, "__version__", "0.0.0-other")    # another Triton
    assert tk.fingerprint(str(root)) != fp4
    assert tk.fingerprint(str(tmp_path / "triton")) != tk.fingerprint(str(root) + "/")


def test_key_is_computed_once_then_read_and_equals_tritons(tk):
    key = tk.install()
    assert tk.STATS["source"] == "computed"
    assert tk.entry_path(tk.fingerprint()).is_relative_to(machine_cache_root())
    import triton.runtime.cache as cache
    assert cache.triton_key() == key                # Triton's cache keys now use it
    tk.reset_for_tests()
    assert cache.triton_key is tk.original()        # undone
    assert tk.install() == key and tk.STATS["source"] == "disk"
    assert key == tk.original()()                   # the same as Triton's own hash


def test_a_stored_key_for_another_installation_is_not_used(tk, monkeypatch):
    key = tk.install()
    tk.reset_for_tests()
    # Triton upgraded in place: another fingerprint, so no stored key (computed again).
    monkeypatch.setattr(tk, "fingerprint", lambda root=None: "f" * 64)
    assert tk.install(compute=False) is None
    assert tk.install() == key and tk.STATS["source"] == "computed"


@pytest.mark.parametrize("damage", ["garbage", "edited key", "other fingerprint", "not a dict"])
def test_a_corrupt_key_entry_warns_and_is_recomputed(tk, damage):
    key = tk.install()
    tk.reset_for_tests()
    fp = tk.fingerprint()
    path = tk.entry_path(fp)
    data = json.loads(path.read_text())
    if damage == "garbage":
        path.write_text("{not json")
    elif damage == "edited key":
        path.write_text(json.dumps(dict(data, key=key + "x")))       # checksum no longer fits
    elif damage == "other fingerprint":
        other = "0" * 64
        path.write_text(json.dumps({"fingerprint": other, "key": "wrong",
                                    "sha256": tk._check(other, "wrong")}))
    else:
        path.write_text("[1, 2]")
    with pytest.warns(CacheWarning, match="corrupt"):
        assert tk.install() == key                  # never the damaged value
    assert tk.STATS["source"] == "computed"
    assert json.loads(path.read_text())["key"] == key                # rewritten, valid
    tk.reset_for_tests()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tk.install() == key


def test_compile_worker_uses_the_parents_key():
    pytest.importorskip("triton")
    code = ("import importlib.util as u, sys; s = u.spec_from_file_location('w', sys.argv[1]); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); assert m.use_parent_key(); "
            "import triton.runtime.cache as c; print(c.triton_key())")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["HLOTK_TRITON_KEY"] = "3.x-parent-key"
    p = subprocess.run([sys.executable, "-c", code, str(ROOT / "codegen/triton/compile_worker.py")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-1500:]
    assert p.stdout.strip() == "3.x-parent-key"


def test_workers_get_the_key_only_once_known(tk):
    assert "HLOTK_TRITON_KEY" not in tk.worker_env({"A": "1"})
    key = tk.install()
    assert tk.worker_env({"A": "1"}) == {"A": "1", "HLOTK_TRITON_KEY": key}


# --- the native launcher's build ------------------------------------------------------------
def test_native_library_lives_in_the_machine_cache_keyed_by_source_and_compiler(tmp_path,
                                                                                monkeypatch):
    pytest.importorskip("jax")
    from runtime.cuda import native
    assert native.library_dir() == machine_cache_root() / "native"
    assert native.library_dir(tmp_path) == tmp_path / "native"      # explicit: as before
    inc = str(tmp_path / "inc")
    base = native._build_key("c++", inc, native._FLAGS)
    assert base == native._build_key("c++", inc, native._FLAGS)
    assert native._build_key("clang++", inc, native._FLAGS) != base
    assert native._build_key("c++", inc, native._FLAGS + ["-g"]) != base
    src = tmp_path / "graph_launch.cc"
    src.write_text(native.SOURCE.read_text() + "\n// edited\n")
    monkeypatch.setattr(native, "SOURCE", src)
    assert native._build_key("c++", inc, native._FLAGS) != base
    monkeypatch.setattr(native, "cuda_driver_version", lambda: "99999")
    assert native._build_key("c++", inc, native._FLAGS) != base


def test_a_damaged_cached_library_warns_and_is_rebuilt(tmp_path, monkeypatch):
    import ctypes.util
    pytest.importorskip("jax")
    from runtime.cuda import native
    from runtime.cuda.errors import NativeLauncherWarning
    bad = tmp_path / "graph_launch_x.so"
    bad.write_bytes(b"not an ELF file")
    good = ctypes.util.find_library("m") or ctypes.util.find_library("c")
    if good is None:
        pytest.skip("no system library to stand in for the rebuilt one")
    monkeypatch.setattr(native, "build", lambda cache_dir=None: Path(good))
    with pytest.warns(NativeLauncherWarning, match="does not load"):
        lib = native._load(bad)
    assert lib is not None and not bad.exists()


def test_prewarm_stays_off_without_a_gpu_or_when_asked(monkeypatch):
    from runtime.cuda import prewarm
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not prewarm.gpu_present()
    monkeypatch.setattr(prewarm, "_THREADS", {})
    monkeypatch.setattr(prewarm, "gpu_present", lambda: True)
    monkeypatch.setenv("HLOTK_PREWARM", "0")
    prewarm.start_at_import()
    assert prewarm._THREADS == {}
    prewarm.start(type("Dev", (), {"type": "cpu"})())         # Triton's interpreter: nothing
    assert prewarm._THREADS == {}


def test_cudnn_start_up_thread_only_for_modules_with_a_convolution(monkeypatch):
    """prewarm.start_libraries: a thread running cuDNN's start-up, once per process, where
    the module being compiled has a convolution and a CUDA device is used; wait_for joins it."""
    import jax.numpy as jnp
    from jax import lax

    import hlo
    from runtime.cuda import prewarm
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("HLOTK_PREWARM_LIBRARIES", raising=False)
    monkeypatch.setattr(prewarm, "_THREADS", {})
    started: list = []
    monkeypatch.setattr(prewarm, "_cudnn_start_up", lambda device: started.append(device))
    x, k = np.zeros((1, 4, 4, 2), np.float32), np.zeros((3, 3, 2, 2), np.float32)
    with_conv = hlo.from_jax(lambda a, b: lax.conv_general_dilated(
        a, b, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")), x, k)
    without = hlo.from_jax(lambda a: jnp.tanh(a) * 2, x)
    cuda, cpu = type("Dev", (), {"type": "cuda"})(), type("Dev", (), {"type": "cpu"})()
    assert prewarm.has_convolution(with_conv) and not prewarm.has_convolution(without)
    assert not prewarm.start_libraries(with_conv, cpu)          # the interpreter's client
    assert not prewarm.start_libraries(without, cuda)
    monkeypatch.setenv("HLOTK_PREWARM_LIBRARIES", "0")
    assert not prewarm.start_libraries(with_conv, cuda)
    monkeypatch.delenv("HLOTK_PREWARM_LIBRARIES")
    pytest.importorskip("torch")
    assert prewarm.start_libraries(with_conv, cuda)
    prewarm.wait_for("cudnn")
    assert started == [cuda] and not prewarm._THREADS["cudnn"].is_alive()
    assert not prewarm.start_libraries(with_conv, cuda)         # once per process
    prewarm.wait_for("no such step")                             # nothing to wait for


def test_gc_freeze_once_per_process_and_off_when_asked(monkeypatch):
    import gc

    from runtime.cuda import prewarm
    calls: list = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append(1))
    monkeypatch.setattr(prewarm, "_FROZEN", False)
    monkeypatch.setenv("HLOTK_GC_FREEZE", "0")
    assert prewarm.freeze_gc() is False and calls == []
    monkeypatch.delenv("HLOTK_GC_FREEZE")
    assert prewarm.freeze_gc() is True and calls == [1]
    assert prewarm.freeze_gc() is False and calls == [1]      # once per process
    monkeypatch.setattr(prewarm, "_FROZEN", False)
    prewarm.start(type("Dev", (), {"type": "cpu"})())         # no CUDA client: no freeze
    assert calls == [1]


# --- flash attention's remembered choice ----------------------------------------------------
@pytest.fixture
def flash(monkeypatch):
    pytest.importorskip("triton")
    import triton.testing
    from codegen.triton import attention
    monkeypatch.setattr(attention, "_TUNED", {})
    monkeypatch.setattr(attention, "_autotune_enabled", lambda t: True)
    monkeypatch.setattr(attention, "_SOURCE_KEY", "src-a")
    timed: list = []

    def bench(fn, warmup=0, rep=0):
        fn()
        timed.append(launched[-1])
        return {(1,): 3.0, (2,): 1.0, (3,): 2.0}[launched[-1]]
    launched: list = []
    monkeypatch.setattr(triton.testing, "do_bench", bench)
    from codegen.triton import autotune
    monkeypatch.setattr(autotune, "device_name", lambda: "NVIDIA H200")
    return attention, launched, timed


def test_flash_choice_is_measured_once_then_read_from_disk(flash, monkeypatch):
    attention, launched, timed = flash
    cands = [(1,), (2,), (3,)]
    key = ("cuda:0", "torch.bfloat16", 64, 64, 128, 1024, 1024, True, False, False, False)
    assert attention._pick(key, cands, launched.append, None) == (2,)
    assert timed == cands
    attention._TUNED.clear()                        # a new process
    timed.clear()
    assert attention._pick(key, cands, launched.append, None) == (2,)
    assert timed == []                              # nothing measured again
    monkeypatch.setattr(attention, "_SOURCE_KEY", "src-b")       # the kernels changed
    attention._TUNED.clear()
    assert attention._pick(key, cands, launched.append, None) == (2,) and timed == cands


def test_flash_stored_choice_outside_the_candidates_is_ignored(flash):
    attention, launched, timed = flash
    key = ("cuda:0", "x")
    attention._store(key, (9,), {(9,): 0.001})      # a config no candidate list has now
    assert attention._pick(key, [(1,), (2,), (3,)], launched.append, None) == (2,)
    assert len(timed) == 3


def test_corrupt_tuning_table_warns_and_measures_again(flash):
    attention, launched, timed = flash
    from codegen.triton import autotune
    path = autotune.tuning_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{truncated")
    with pytest.warns(CacheWarning, match="unreadable"):
        assert attention._pick(("k",), [(1,), (2,), (3,)], launched.append, None) == (2,)
    assert len(timed) == 3
    assert json.loads(path.read_text())              # rewritten whole


def test_collecting_launches_every_candidate_and_runs_nothing(flash):
    attention, launched, timed = flash
    from codegen.triton import parallel
    with parallel.collecting():
        assert parallel.collecting_now()
        assert attention._pick(("k",), [(1,), (2,), (3,)], launched.append, None) == (1,)
    assert not parallel.collecting_now()
    assert launched == [(2,), (3,)] and timed == []   # the caller launches (1,) itself
    assert attention._TUNED == {}                     # nothing chosen yet


def test_collected_jobs_known_from_an_earlier_process_start_no_pool(monkeypatch):
    pytest.importorskip("triton")
    from codegen.triton import parallel
    monkeypatch.setattr(parallel, "_DONE", None)
    monkeypatch.setattr(parallel, "_POOL", None)
    jobs = [("module:codegen.triton.attention", "_flash_fwd", '{"a": 1}'),
            ("module:codegen.triton.attention", "_flash_fwd", '{"a": 2}')]
    parallel._mark([parallel.spec_key(d) for _, _, d in jobs])
    monkeypatch.setattr(parallel, "_DONE", None)                # a new process
    assert parallel.precompile([], jobs) == {"compiled": 0, "known": 2, "failed": 0, "inline": 0}
    assert parallel.start_for([], extra=4) == 0 and parallel._POOL is None


def _flash_pool_check(_tmp: str) -> None:
    """The body of the next test, in a process of its own (a stand-in driver plays the
    H200; no TRITON_INTERPRET)."""
    import torch
    from triton.runtime.jit import JITFunction

    import runtime
    from codegen.triton import attention, parallel
    from tests.test_fusion_attention import _attention, _attention_fusions, _inputs
    from tests.triton_stand_in import use_h200_stand_in

    use_h200_stand_in()
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    args = _inputs((1, 64, 2, 16))
    c = runtime.jit(_attention(causal=True), target="h200").lower(*args).compile()
    (fa,) = _attention_fusions(c)
    ins = [torch.from_numpy(a) for a in args]
    cands = [(64, 32, 4, 2), (32, 32, 4, 1)]
    attention._candidates = lambda nbytes, d: list(cands)
    attention._autotune_enabled = lambda t: True
    with parallel.collecting() as jobs:
        attention.flash_attention(fa, ins)
    assert len({d for _, _, d in jobs}) == 2, jobs
    assert all(j[0] == "module:codegen.triton.attention" and j[1] == "_flash_fwd"
               for j in jobs), jobs
    parallel.INLINE_MAX = 0
    stats = parallel.precompile([], jobs)
    assert stats["compiled"] == 2, stats
    entries = sorted(cache.iterdir())
    # Each candidate's real launch (compile only: no GPU) finds its binary in the cache.
    run = JITFunction.run
    JITFunction.run = lambda self, *a, grid, warmup, **k: run(self, *a, grid=grid, warmup=True, **k)
    attention._autotune_enabled = lambda t: False
    for cfg in cands:
        attention._candidates = lambda nbytes, d, cfg=cfg: [cfg]
        attention.flash_attention(fa, ins)
    assert sorted(cache.iterdir()) == entries, "the JIT compiled a candidate again"


@pytest.mark.slow
def test_flash_candidates_compile_in_the_pool_and_the_jit_finds_them(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # Triton's launch path: the check turns its launches into compiles (JITFunction.run
    # with warmup=True) on CPU tensors; the direct launch would launch them
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), HLOTK_CACHE_DIR=str(tmp_path / "c"),
               PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", HLOTK_COMPILE_INPROCESS="0",
               HLOTK_TRITON_LAUNCH="triton")
    p = subprocess.run([sys.executable, "-c", "import sys, tests.test_compile_caches as t; "
                        "t._flash_pool_check(sys.argv[1])", str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]


# --- Triton's per-function key of generated kernels -----------------------------------------
def _jit_hash_check(_tmp: str) -> None:
    """In a process of its own (no TRITON_INTERPRET): a generated kernel's Triton key,
    computed by Triton in one "process", is read back in the next without parsing."""
    import jax.numpy as jnp
    from triton.runtime.jit import JITFunction

    from codegen.triton import compile_fusion, jit_hash
    from codegen.triton import kernel as kmod
    from tests.test_autotune import _fusion
    x = np.ones((64, 32), np.float32)
    kernel = compile_fusion(_fusion(lambda x, y: jnp.tanh(x) * y + 1, x, x), target="h200")
    fn = kernel.fn
    assert not kernel._hash_primed and fn.hash is None          # nothing stored yet
    want = fn.cache_key                                          # Triton's own computation
    jit_hash.record(fn, kernel.path, kernel.name)
    jit_hash.flush()
    assert json.loads(jit_hash.table_path().read_text())
    # A new process: module and function loaded again, key read, no ast.parse.
    kmod._MODULES.clear()
    jit_hash.reset_for_tests()
    kernel._fn = None
    parsed = []
    orig = JITFunction.parse
    JITFunction.parse = lambda self: parsed.append(self) or orig(self)
    fn2 = kernel.fn
    assert fn2 is not fn and kernel._hash_primed
    assert fn2.cache_key == want and parsed == []
    # The file edited: no entry for it, Triton computes the key.
    text = kernel.path.read_text()
    kernel.path.write_text(text + "\n# edited\n")
    kmod._MODULES.clear()
    kernel._fn = None
    assert kernel.fn.hash is None and not kernel._hash_primed


def test_generated_kernel_triton_key_is_read_back_and_keyed_by_file(tmp_path):
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(HLOTK_CACHE_DIR=str(tmp_path / "c"), HLOTK_MACHINE_CACHE_DIR=str(tmp_path / "m"),
               PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, "-c", "import sys, tests.test_compile_caches as t; "
                        "t._jit_hash_check(sys.argv[1])", str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]


def test_corrupt_jit_hash_table_warns_and_primes_nothing(tmp_path):
    pytest.importorskip("triton")
    from codegen.triton import jit_hash
    jit_hash.reset_for_tests()
    path = jit_hash.table_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[garbage")
    f = type("Fn", (), {"hash": None})()
    src = tmp_path / "k.py"
    src.write_text("x = 1\n")
    with pytest.warns(CacheWarning, match="unreadable"):
        assert not jit_hash.prime(f, src, "k")
    assert f.hash is None
    jit_hash.reset_for_tests()
    path.write_text(json.dumps({jit_hash.entry_key(src, "k"): "not a sha"}))
    assert not jit_hash.prime(f, src, "k") and f.hash is None     # a malformed value
    jit_hash.reset_for_tests()


def test_scratch_like_keeps_strides_and_alignment_class():
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    from runtime.cuda.backend import scratch_like
    arena = torch.empty(4096, dtype=torch.bfloat16)
    for offset, shape, stride in [(0, (2, 3, 8), (48, 16, 1)), (8, (2, 8, 3), (48, 1, 16)),
                                  (3, (4, 5), (1, 4)), (0, (0, 4), (4, 1))]:
        view = torch.as_strided(arena, shape, stride, offset)
        s = scratch_like(view)
        assert (tuple(s.shape), s.stride(), s.dtype) == (shape, stride, view.dtype)
        assert (s.data_ptr() % 16 == 0) == (view.data_ptr() % 16 == 0)
        assert s.untyped_storage().data_ptr() != arena.untyped_storage().data_ptr()

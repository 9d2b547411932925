"""Autotuning bookkeeping without a GPU: levels, cost-model pruning of candidate configs,
the persisted tuning table (kernel source hash + device + Triton version) and the
calibration records beside the cost model's prediction."""
from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import hlo
from codegen.triton import TritonCodegenError, compile_fusion
from codegen.triton import autotune as at
from passes import run_pipeline
from passes.fusion.cost_model import get_device


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(at, "device_name", lambda: "NVIDIA H200")


def _fusion(fn, *args):
    module = hlo.from_jax(fn, *args)
    run_pipeline(module, "inline,fixpoint(simplify,cse,dce),layout-assignment{target=gpu},"
                         "fusion{target=h200}")
    fusions = [i for i in module.entry.instructions if i.opcode == "fusion"]
    assert len(fusions) == 1
    return fusions[0]


def _gemm_fusion():
    a = np.ones((2048, 1024), jnp.bfloat16)
    b = np.ones((1024, 4096), jnp.bfloat16)
    return _fusion(lambda a, b: jnp.tanh(a @ b) * 2, a, b)


@pytest.mark.parametrize("value,level", [(None, 0), ("0", 0), ("1", 1), ("2", 2), ("on", 1),
                                         (True, 1), (False, 0), (5, 2)])
def test_levels(value, level, monkeypatch):
    monkeypatch.delenv("HLOTK_AUTOTUNE", raising=False)
    assert at.autotune_level(value) == level


def test_bad_level_names_the_variable(monkeypatch):
    monkeypatch.setenv("HLOTK_AUTOTUNE", "fast")
    with pytest.raises(TritonCodegenError, match="HLOTK_AUTOTUNE='fast'"):
        at.autotune_level()


def test_wave_model_prefers_full_waves():
    spec = get_device("h200")        # 132 SMs
    # 132 programs of 4 warps: one partial wave (132 of 132*16 slots) -> slower than the
    # same work in 16*132 programs, which fill the machine.
    few = at.predict_config_us(100.0, (132,), {"num_warps": 4}, spec)
    full = at.predict_config_us(100.0, (16 * 132,), {"num_warps": 4}, spec)
    assert full == pytest.approx(100.0)
    assert few > full
    # Fewer programs than SMs: only that share of the machine works.
    half = at.predict_config_us(100.0, (66,), {"num_warps": 32}, spec)
    assert half == pytest.approx(2.0 + 98.0 * 2)


def test_pruned_keeps_default_and_best_three_exhaustive_keeps_all():
    kernel = compile_fusion(_gemm_fusion(), target="h200")
    cands = kernel.plan.candidates
    assert len(cands) > at.PRUNED_TOP + 1
    spec = get_device("h200")
    pruned = at.ranked_candidates(kernel, 1, spec)
    assert pruned[0] == kernel.config and len(pruned) == at.PRUNED_TOP + 1
    rest = [c for c in cands if c != kernel.config]
    costs = {json.dumps(c, sort_keys=True): at.predict_config_us(
        kernel.predicted_us, kernel.plan.grid(dict(c)), c, spec) for c in rest}
    worst_kept = max(costs[json.dumps(c, sort_keys=True)] for c in pruned[1:])
    dropped = [c for c in rest if c not in pruned]
    assert all(costs[json.dumps(c, sort_keys=True)] >= worst_kept for c in dropped)
    assert at.ranked_candidates(kernel, 2, spec) == cands


def test_small_loop_kernels_time_nothing_at_level_1_and_everything_at_level_2():
    """A loop kernel's candidates differ only in block size and warps: a small one (predicted
    under LOOP_TIMED_FROM_US) compiles the template's own config at level 1 and times
    nothing; level 2 still times them all."""
    x = np.ones((1024, 1024), np.float32)       # 12 MB moved: ~4 µs predicted on the H200
    fusion = _fusion(lambda x, y: jnp.tanh(x) * y + 1, x, x)
    spec = get_device("h200")
    kernel = compile_fusion(fusion, target="h200", autotune=1)
    assert kernel.template == "loop"
    assert kernel.predicted_us < at.LOOP_TIMED_FROM_US
    assert kernel.config == kernel.plan.config
    # BLOCK 256/2, 512/4, 1024/4, 2048/8, 4096/8 over 1M elements; the default is 1024/4
    assert [(c["BLOCK"], c["num_warps"]) for c in kernel.plan.candidates] == \
        [(256, 2), (512, 4), (1024, 4), (2048, 8), (4096, 8)]
    assert (kernel.config["BLOCK"], kernel.config["num_warps"]) == (1024, 4)
    assert at.ranked_candidates(kernel, 1, spec) == [kernel.plan.config]
    assert kernel.autotune == 0 and not at.needs_timing(kernel, 1, spec)
    exhaustive = compile_fusion(fusion, target="h200", autotune=2)
    assert exhaustive.autotune == 2 and at.needs_timing(exhaustive, 2, spec)
    assert at.ranked_candidates(exhaustive, 2, spec) == kernel.plan.candidates
    # A config measured before (at level 2) is still used at level 1.
    best = dict(kernel.plan.candidates[0])
    at.store(kernel, best, [(dict(kernel.config), 5.0), (best, 4.0)])
    again = compile_fusion(fusion, target="h200", autotune=1)
    assert again.config == best and again.autotune == 0


def test_large_loop_kernels_are_timed_at_level_1_only_when_asked(monkeypatch):
    x = np.ones((4096, 4096), np.float32)       # 201 MB moved: ~50 µs predicted
    fusion = _fusion(lambda x, y: jnp.tanh(x) * y + 1, x, x)
    spec = get_device("h200")
    assert compile_fusion(fusion, target="h200", autotune=1).autotune == 0   # the default
    monkeypatch.setenv("HLOTK_TUNE_LOOPS_FROM_US", "10")
    kernel = compile_fusion(fusion, target="h200", autotune=1)
    assert kernel.template == "loop" and kernel.predicted_us >= 10
    assert kernel.autotune == 1
    ranked = at.ranked_candidates(kernel, 1, spec)
    assert ranked[0] == kernel.config and len(ranked) == at.PRUNED_TOP + 1
    # the bound from the environment: never (inf) or always (0)
    monkeypatch.setenv("HLOTK_TUNE_LOOPS_FROM_US", "inf")
    assert compile_fusion(fusion, target="h200", autotune=1).autotune == 0
    monkeypatch.setenv("HLOTK_TUNE_LOOPS_FROM_US", "0")
    small_fusion = _fusion(lambda x: x * 2, np.ones(4096, np.float32))
    small = compile_fusion(small_fusion, target="h200", autotune=1)
    # a launch-bound kernel (~2 µs) stays untimed under the bound of every template ...
    assert small.template == "loop" and small.predicted_us < at.TIMED_FROM_US
    assert small.autotune == 0
    # ... unless that bound is lowered too
    monkeypatch.setenv("HLOTK_TUNE_FROM_US", "0")
    assert compile_fusion(small_fusion, target="h200", autotune=1).autotune == 1
    monkeypatch.setenv("HLOTK_TUNE_LOOPS_FROM_US", "soon")
    with pytest.raises(TritonCodegenError, match="HLOTK_TUNE_LOOPS_FROM_US='soon'"):
        compile_fusion(fusion, target="h200", autotune=1)


def test_templates_with_tiles_are_still_timed_at_level_1():
    x = np.ones((4096, 1024), np.float32)
    rows = compile_fusion(_fusion(lambda x: jnp.exp(x) / jnp.sum(jnp.exp(x), axis=-1,
                                                                   keepdims=True), x),
                          target="h200", autotune=1)
    assert rows.template not in at.UNTIMED_AT_PRUNED and rows.autotune == 1
    assert len(at.ranked_candidates(rows, 1, get_device("h200"))) > 1
    assert compile_fusion(_gemm_fusion(), target="h200", autotune=1).autotune == 1


def test_launch_bound_kernels_of_any_template_time_nothing_at_level_1(monkeypatch):
    """A reduction the cost model puts under TIMED_FROM_US (a 512x64 column sum: ~2 µs,
    the launch term) compiles only its template's config at level 1; level 2 and
    ``HLOTK_TUNE_FROM_US=0`` still time its candidates."""
    monkeypatch.delenv("HLOTK_TUNE_FROM_US", raising=False)
    x = np.ones((512, 64), np.float32)
    fusion = _fusion(lambda x: jnp.sum(jnp.tanh(x) * 2, axis=0), x)
    spec = get_device("h200")
    kernel = compile_fusion(fusion, target="h200", autotune=1)
    assert kernel.template not in at.UNTIMED_AT_PRUNED
    assert 0 < kernel.predicted_us < at.TIMED_FROM_US == 3.0
    assert len(kernel.plan.candidates) > 1
    assert at.ranked_candidates(kernel, 1, spec) == [kernel.config]
    assert kernel.autotune == 0 and not at.needs_timing(kernel, 1, spec)
    assert at.ranked_candidates(kernel, 2, spec) == kernel.plan.candidates
    monkeypatch.setenv("HLOTK_TUNE_FROM_US", "0")
    timed = compile_fusion(fusion, target="h200", autotune=1)
    assert timed.autotune == 1
    assert len(at.ranked_candidates(timed, 1, spec)) == at.PRUNED_TOP + 1
    monkeypatch.setenv("HLOTK_TUNE_FROM_US", "tiny")
    with pytest.raises(TritonCodegenError, match="HLOTK_TUNE_FROM_US='tiny'"):
        compile_fusion(fusion, target="h200", autotune=1)


def test_row_tiles_default_to_16_elements_per_thread_and_level_1_compiles_none_heavier():
    """A [8192, 4096] softmax: one row of 4096 per program at 8 warps (16 per thread, where
    the old default had 32); level 1 leaves out every candidate with more per thread (their
    Triton compiles were the pool's slowest: 0.19-1.18 s against ~0.1 on the H200), level 2
    keeps them all."""
    x = np.ones((8192, 4096), np.float32)
    rows = compile_fusion(_fusion(lambda x: jnp.exp(x) / jnp.sum(jnp.exp(x), axis=-1,
                                                                   keepdims=True), x),
                          target="h200", autotune=1)
    assert rows.template == "normalization"
    assert (rows.config["BLOCK_M"], rows.config["BLOCK_N"], rows.config["num_warps"]) == \
        (1, 4096, 8)
    assert at.elements_per_thread(rows.config) == 16
    spec = get_device("h200")
    pruned = at.ranked_candidates(rows, 1, spec)
    assert pruned[0] == rows.config and len(pruned) > 1
    assert all(at.elements_per_thread(c) <= 16 for c in pruned)
    heavier = [c for c in rows.plan.candidates if at.elements_per_thread(c) > 16]
    assert heavier and all(c in at.ranked_candidates(rows, 2, spec) for c in heavier)
    # GEMM tiles are not row tiles: no bound applies to them.
    assert at.elements_per_thread({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}) is None


def test_stored_result_is_reused_only_for_same_device_and_triton(monkeypatch):
    fusion = _gemm_fusion()
    kernel = compile_fusion(fusion, target="h200", autotune=1)
    assert kernel.autotune == 1 and kernel.predicted_us > 0
    best = dict(kernel.plan.candidates[-1])
    at.store(kernel, best, [(dict(kernel.config), 30.0), (best, 20.0)])
    again = compile_fusion(fusion, target="h200", autotune=1)
    assert again.autotune == 0 and again.config == best      # nothing left to measure
    with monkeypatch.context() as m:
        m.setattr(at, "triton_version", lambda: "99.0")
        other = compile_fusion(fusion, target="h200", autotune=1)
        assert other.autotune == 1 and other.config == kernel.config
    with monkeypatch.context() as m:
        m.setattr(at, "device_name", lambda: "NVIDIA H100 80GB HBM3")
        assert compile_fusion(fusion, target="h200", autotune=1).autotune == 1
    # Off: the template's default config, whatever is stored.
    assert compile_fusion(fusion, target="h200", autotune=0).config == kernel.config


def test_measurements_are_recorded_beside_the_prediction():
    kernel = compile_fusion(_gemm_fusion(), target="h200")
    at.store(kernel, kernel.config, [(dict(kernel.config), 42.0)])
    at.record_measurement(kernel, 40.0)
    recs = [json.loads(ln) for ln in at.records_path().read_text().splitlines()]
    assert [r["measured_us"] for r in recs] == [42.0, 40.0]
    assert [r["source"] for r in recs] == ["autotune", "profile"]
    r = recs[0]
    assert r["predicted_us"] == pytest.approx(kernel.predicted_us)
    assert r["device"] == "NVIDIA H200" and r["template"] == "gemm"
    # the GEMM reads a, b and writes the result once: 2 * (2048*1024 + 1024*4096 + 2048*4096)
    assert r["bytes"] == 2 * (2048 * 1024 + 1024 * 4096 + 2048 * 4096)
    assert r["flops"] >= 2 * 2048 * 1024 * 4096


def test_progress_bar_is_quiet_off_a_terminal(capsys, monkeypatch):
    monkeypatch.setenv("HLOTK_PROGRESS", "1")
    assert not at.progress_enabled()      # pytest's stderr is not a terminal
    with at.autotune_progress(3, "m"):
        at._advance("k")
    assert capsys.readouterr().err == ""


def test_precompile_skips_known_variants_and_leaves_failures_to_the_launch(monkeypatch):
    from codegen.triton import parallel
    # On a GPU host ``import runtime`` has started the early pool in this process already
    # (prewarm.start_at_import); what is checked is that these calls start none.
    monkeypatch.setattr(parallel, "_POOL", None)

    class Fn:
        def warmup(self, *args, **kwargs):
            raise RuntimeError("no GPU here")
    kernel = compile_fusion(_gemm_fusion(), target="h200")
    kernel._fn = Fn()
    parallel._DONE = None
    assert parallel.precompile([(kernel, [], kernel.config)]) == \
        {"compiled": 0, "known": 0, "failed": 1, "inline": 0}
    parallel._mark([parallel.variant_key(kernel, kernel.config)])
    parallel._DONE = None                       # a new process reads the file
    other = dict(kernel.config, num_warps=2)
    assert parallel.precompile([(kernel, [], kernel.config), (kernel, [], other)]) == \
        {"compiled": 0, "known": 1, "failed": 1, "inline": 0}
    assert parallel._POOL is None               # nothing to compile: no pool started


def _pool_check(_tmp: str) -> None:
    """The body of the next test, in a process of its own (Triton imported in interpret
    mode, as other test modules leave it, cannot compile for a GPU)."""
    import os
    from pathlib import Path

    import torch

    from codegen.triton import parallel
    from tests.triton_stand_in import use_h200_stand_in

    cache = Path(os.environ["TRITON_CACHE_DIR"])
    use_h200_stand_in()
    if os.environ.get("HLOTK_TEST_WORKERS_NEVER_READY") == "1":
        parallel._LAUNCH = "import time; time.sleep(120)"     # this process compiles it
    if os.environ.get("HLOTK_TEST_NO_TARGET") == "1":
        # As Triton 3.6 writes it: no target in the specialization; the job carries ours.
        import json as _json
        spec = parallel._specialization

        def without_target(*a):
            data = _json.loads(spec(*a))
            data.pop("target", None)
            return _json.dumps(data)
        parallel._specialization = without_target
    x = np.ones((512, 128), np.float32)
    kernel = compile_fusion(_fusion(lambda x, y: jnp.tanh(x) * y + 1, x, x), target="h200")
    t = torch.ones(512, 128)
    args = kernel._args([torch.empty(512, 128)], [t, t])
    # One new variant and no pool yet: left to the launch (cheaper than starting workers).
    assert parallel.precompile([(kernel, args, kernel.config)])["inline"] == 1
    assert parallel._POOL is None
    assert parallel.start_for([(kernel, kernel.config)]) == 1 and parallel._POOL is None
    parallel.INLINE_MAX = 0                     # as if there were more: the pool compiles it
    assert parallel.start_for([(kernel, kernel.config)]) == 1
    assert len(parallel._POOL.procs) == 1
    stats = parallel.precompile([(kernel, args, kernel.config)])
    assert stats["compiled"] == 1, stats
    here = os.environ.get("HLOTK_TEST_WORKERS_NEVER_READY") == "1"
    assert parallel.STATS["inproc"] == (1 if here else 0), parallel.STATS
    if not here:        # Triton's preload under a driver that knows only the target; a
        # Triton whose preload reads the target from the data (3.9), without it: triton.compile
        ways = ("preload", "direct") if os.environ.get("HLOTK_TEST_NO_TARGET") == "1" \
            else ("preload",)
        assert parallel.STATS["log"][-1].get("via") in ways, parallel.STATS["log"]
    entries = sorted(cache.iterdir())
    cfg, warps, stages = parallel._split(kernel.config)
    kernel.fn.warmup(*args, grid=kernel.plan.grid(dict(cfg)), **cfg, num_warps=warps,
                     num_stages=stages)
    assert sorted(cache.iterdir()) == entries, "the JIT compiled the variant again"


@pytest.mark.parametrize("where", ["worker", "worker, no target in the data", "this process"])
def test_pool_compiles_what_the_jit_then_finds_in_tritons_cache(tmp_path, where):
    """The compile workers, or this process while no worker is ready, compile exactly the
    variant a launch looks up: after ``precompile`` the JIT's own compile of that launch
    adds nothing to Triton's cache. A stand-in driver plays the H200 (the JIT asks a
    driver for device, stream, target)."""
    import os
    import subprocess
    import sys
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), HLOTK_CACHE_DIR=str(tmp_path / "c"),
               PYTHONPATH=str(root), JAX_PLATFORMS="cpu",
               HLOTK_COMPILE_INPROCESS="0" if where.startswith("worker") else "1",
               HLOTK_TEST_WORKERS_NEVER_READY="0" if where.startswith("worker") else "1",
               HLOTK_TEST_NO_TARGET="1" if "no target" in where else "0")
    p = subprocess.run([sys.executable, "-c", "import sys, tests.test_autotune as t; "
                        "t._pool_check(sys.argv[1])", str(tmp_path)], cwd=root, env=env,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]


def test_compile_worker_imports_triton_and_nothing_of_hlotk():
    """A worker's start-up is Triton's import: it must not pull in numpy, jax, torch or
    hlotk's packages (``-X importtime`` lists every module it imported)."""
    import subprocess
    import sys
    pytest.importorskip("triton")
    from codegen.triton import parallel
    import os
    # As on a GPU: Triton's interpreter (which other test modules turn on) imports numpy.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-X", "importtime", "-c", parallel._LAUNCH,
                        str(parallel.WORKER)], input="", capture_output=True, text=True,
                       timeout=120, cwd=str(Path(__file__).resolve().parents[1]), env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    imported = {ln.split("|")[-1].strip().split(".")[0] for ln in p.stderr.splitlines()
                if ln.startswith("import time:")}
    assert "triton" in imported
    assert not imported & {"numpy", "jax", "torch", "hlo", "codegen", "passes", "runtime"}, \
        sorted(imported & {"numpy", "jax", "torch", "hlo", "codegen", "passes", "runtime"})

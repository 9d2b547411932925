"""The Triton compile pool's process logic without a GPU (codegen/triton/parallel.py,
compile_worker.py): sizes from the environment, the ready/answer protocol, a worker that
dies or never starts (its jobs are left to the launch, or compiled here: never a wrong
kernel), this process compiling while no worker is ready, and no process left behind."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from codegen.triton import parallel
from codegen.triton.elemental import TritonCodegenError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh(monkeypatch):
    """A pool of this test's own, stats reset, closed after."""
    monkeypatch.setattr(parallel, "_POOL", None)
    monkeypatch.setattr(parallel, "STATS", {k: ([] if isinstance(v, list) else 0)
                                            for k, v in parallel.STATS.items()})
    pools: list = []
    yield pools
    for p in pools:
        p.close()


def test_pool_sizes_come_from_the_environment(monkeypatch):
    monkeypatch.setattr(parallel, "_cpus", lambda: 16)
    monkeypatch.delenv("HLOTK_COMPILE_WORKERS", raising=False)
    monkeypatch.delenv("HLOTK_COMPILE_EARLY", raising=False)
    assert parallel.pool_size() == 15          # one CPU left to this process's own compiles
    assert parallel.early_size() == 4
    monkeypatch.setattr(parallel, "_cpus", lambda: 1)
    assert parallel.pool_size() == 1
    monkeypatch.setenv("HLOTK_COMPILE_WORKERS", "3")
    assert parallel.pool_size() == 3
    monkeypatch.setenv("HLOTK_COMPILE_EARLY", "8")
    assert parallel.early_size() == 3          # never more than the pool
    monkeypatch.setenv("HLOTK_COMPILE_EARLY", "0")
    assert parallel.early_size() == 0
    monkeypatch.setenv("HLOTK_COMPILE_WORKERS", "0")
    assert parallel.pool_size() == 0
    monkeypatch.setenv("HLOTK_COMPILE_WORKERS", "many")
    with pytest.raises(TritonCodegenError, match="HLOTK_COMPILE_WORKERS"):
        parallel.pool_size()


def test_no_early_start_when_turned_off_or_interpreting(fresh, monkeypatch):
    monkeypatch.setenv("HLOTK_COMPILE_EARLY", "0")
    assert parallel.start_early() == 0 and parallel._POOL is None
    monkeypatch.setenv("HLOTK_COMPILE_EARLY", "2")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert parallel.start_early() == 0 and parallel._POOL is None


def _dying_job(tmp_path: Path) -> tuple[str, str, str]:
    path = tmp_path / "dies.py"
    path.write_text("import os\nos._exit(3)\n")      # the worker exits while loading it
    return (str(path), "kernel", "{}")


def test_a_worker_that_dies_on_a_job_leaves_it_to_the_launch(fresh, tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTK_COMPILE_WORKERS", "1")
    pool = parallel.WorkerPool()
    fresh.append(pool)
    t0 = time.perf_counter()
    assert pool.run([_dying_job(tmp_path)]) == [False]      # not compiled: the launch will
    assert time.perf_counter() - t0 < 60
    assert pool.workers[0].dead
    assert parallel.STATS["log"][0]["error"] == "the worker exited"
    pool.close()
    assert all(p.returncode is not None for p in pool.procs)     # reaped: no zombie


def test_a_worker_that_never_starts_is_given_no_job(fresh, monkeypatch):
    monkeypatch.setenv("HLOTK_COMPILE_WORKERS", "2")
    monkeypatch.setenv("HLOTK_COMPILE_INPROCESS", "0")
    monkeypatch.setattr(parallel, "_LAUNCH", "import sys; sys.exit(1)")
    pool = parallel.WorkerPool()
    fresh.append(pool)
    assert pool.run([("a.py", "k", "{}"), ("b.py", "k", "{}")]) == [False, False]
    assert all(w.dead for w in pool.workers) and parallel.STATS["jobs"] == 0
    pool.close()
    assert all(p.returncode is not None for p in pool.procs)


def test_this_process_compiles_while_no_worker_is_ready(fresh, monkeypatch):
    """Workers still starting (here: never ready) take no job; this process compiles them
    (a stand-in compile), and closing the pool ends the workers still starting."""
    monkeypatch.setenv("HLOTK_COMPILE_WORKERS", "2")
    monkeypatch.setattr(parallel, "_LAUNCH", "import time; time.sleep(120)")
    from codegen.triton import compile_worker
    compiled: list = []
    monkeypatch.setattr(compile_worker, "compile_specialization",
                        lambda fn, data, target="": compiled.append((fn, data)))
    pool = parallel.WorkerPool()
    fresh.append(pool)
    jobs = [("x.py", "k", '{"a": 1}'), ("x.py", "k", '{"a": 2}')]
    assert pool.run(jobs, ["fn1", "fn2"]) == [True, True]
    assert sorted(compiled) == [("fn1", '{"a": 1}'), ("fn2", '{"a": 2}')]
    assert parallel.STATS["inproc"] == 2
    t0 = time.perf_counter()
    pool.close()
    assert time.perf_counter() - t0 < 15          # terminated, not waited for 120 s
    assert all(p.returncode is not None for p in pool.procs)


def test_idle_work_runs_once_after_the_jobs_are_given(fresh, monkeypatch):
    """``run_stream(..., idle=f)``: ``f`` runs once, after every job is handed out and
    before the wait for answers (runtime/deferred.py's cache stores go there); an error in
    it changes no result."""
    monkeypatch.setenv("HLOTK_COMPILE_WORKERS", "1")
    monkeypatch.setattr(parallel, "_LAUNCH", "import time; time.sleep(120)")
    from codegen.triton import compile_worker
    order: list = []
    monkeypatch.setattr(compile_worker, "compile_specialization",
                        lambda fn, data, target="": order.append(("compile", fn)))

    def idle():
        order.append(("idle", None))
        raise OSError("a cache store failed")
    pool = parallel.WorkerPool()
    fresh.append(pool)
    jobs = [("x.py", "k", '{"a": 1}'), ("x.py", "k", '{"a": 2}')]
    assert pool.run_stream(zip(jobs, ["fn1", "fn2"]), 2, idle=idle) == [True, True]
    assert order == [("compile", "fn1"), ("compile", "fn2"), ("idle", None)]


def test_a_compile_error_here_is_left_to_the_launch(fresh, monkeypatch):
    monkeypatch.setenv("HLOTK_COMPILE_WORKERS", "1")
    monkeypatch.setattr(parallel, "_LAUNCH", "import time; time.sleep(120)")
    from codegen.triton import compile_worker

    def fails(fn, data, target=""):
        raise RuntimeError("ptxas said no")
    monkeypatch.setattr(compile_worker, "compile_specialization", fails)
    pool = parallel.WorkerPool()
    fresh.append(pool)
    assert pool.run([("x.py", "k", "{}")], ["fn"]) == [False]
    assert "ptxas said no" in parallel.STATS["log"][0]["error"]


def test_worker_start_up_is_reported_and_imports_nothing_of_hlotk():
    """``ready`` comes first with the start-up's seconds; a warm-up compile (for an sm_90
    target, no GPU needed) goes to a throwaway cache, not Triton's."""
    pytest.importorskip("triton")
    import json
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cache = ROOT / ".pytest-no-such-cache"
    env.update(HLOTK_WORKER_WARM="compile", HLOTK_WORKER_T0=repr(time.time()),
               TRITON_CACHE_DIR=str(cache))
    p = subprocess.run([sys.executable, "-X", "importtime", "-c", parallel._LAUNCH,
                        str(parallel.WORKER)], input="", capture_output=True, text=True,
                       timeout=240, cwd=str(ROOT), env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    line = p.stdout.splitlines()[0]
    assert line.startswith("ready ")
    info = json.loads(line[6:])
    assert "warm_error" not in info, info
    assert info["warm_compile"] > 0 and info["import"] > 0 and info["spawn"] >= 0
    assert not cache.exists()                     # the warm-up wrote nothing there
    imported = {ln.split("|")[-1].strip().split(".")[0] for ln in p.stderr.splitlines()
                if ln.startswith("import time:")}
    assert not imported & {"numpy", "jax", "torch", "hlo", "codegen", "passes", "runtime"}


def test_a_job_compiles_for_the_target_its_data_names_else_the_parents():
    pytest.importorskip("triton")
    import json
    from codegen.triton.compile_worker import job_target
    ours = json.dumps({"backend": "cuda", "arch": 90, "warp_size": 32})
    named = json.dumps({"target": {"backend": "cuda", "arch": 80, "warp_size": 32}})
    assert job_target(named, ours).arch == 80               # the data's own wins
    assert job_target("{}", ours).arch == 90                # Triton 3.6: none in the data
    with pytest.raises(ValueError, match="no target"):
        job_target("{}", "")


def test_a_job_past_the_time_limit_is_killed_and_left_to_the_launch(fresh, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("HLOTK_COMPILE_WORKERS", "1")
    monkeypatch.setenv("HLOTK_COMPILE_TIMEOUT", "1")
    path = tmp_path / "hangs.py"
    path.write_text("import time\ntime.sleep(120)\n")      # a compiler that never answers
    pool = parallel.WorkerPool()
    fresh.append(pool)
    t0 = time.perf_counter()
    assert pool.run([(str(path), "kernel", "{}")]) == [False]
    assert time.perf_counter() - t0 < 60
    assert "HLOTK_COMPILE_TIMEOUT" in parallel.STATS["log"][0]["error"]
    pool.close()
    assert all(p.returncode is not None for p in pool.procs)


def test_the_longest_compiles_go_to_the_pool_first(fresh, tmp_path, monkeypatch):
    """Jobs reach the workers largest kernel source first, and within one kernel the
    config holding the most elements per thread first (a long compile taken last would end
    the pool alone); each job's result still marks its own variant compiled."""
    class Kernel:
        def __init__(self, name: str, size: int) -> None:
            self.name, self.key = name, name
            self.path = tmp_path / f"{name}.py"
            self.path.write_text("#" * size)
            self.fn = object()
    small, big = Kernel("small", 1000), Kernel("big", 9000)
    wide = {"BLOCK": 4096, "num_warps": 4}       # 32 elements per thread
    narrow = {"BLOCK": 1024, "num_warps": 8}     # 4
    jobs = [(small, [], narrow), (small, [], wide), (big, [], narrow)]
    assert parallel.compile_weight(big, narrow) > parallel.compile_weight(small, wide) \
        > parallel.compile_weight(small, narrow)
    handed: list = []

    class Pool:
        def run_stream(self, source, expected, idle=None):
            for job, _ in source:
                handed.append((job[1], job[2]))
            return [name != "small" or data != "small|4096" for name, data in handed]
    monkeypatch.setattr(parallel, "_pool", lambda: Pool())
    monkeypatch.setattr(parallel, "_POOL", object())
    monkeypatch.setattr(parallel, "_done", lambda: set())
    marked: list = []
    monkeypatch.setattr(parallel, "_mark", lambda keys: marked.extend(keys))
    monkeypatch.setattr(parallel, "current_target", lambda: "{}")
    monkeypatch.setattr(parallel, "_specialization",
                        lambda k, args, config: f"{k.name}|{config['BLOCK']}")
    monkeypatch.setattr(parallel, "variant_key", lambda k, config: f"{k.name}/{config['BLOCK']}")
    stats = parallel.precompile(jobs)
    assert handed == [("big", "big|1024"), ("small", "small|4096"), ("small", "small|1024")]
    assert stats["compiled"] == 2 and stats["failed"] == 1
    assert sorted(marked) == ["big/1024", "small/1024"]

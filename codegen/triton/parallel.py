"""Compile many Triton kernel variants at once, in worker processes, before their first launch.

Triton compiles a ``@triton.jit`` function at its first launch with given arguments, one
after another, each 0.3-2 s of Python, MLIR, LLVM and ptxas. ``precompile(jobs)`` asks
Triton what each (kernel, arguments, config) would compile, without compiling it: a
``jit_cache_hook`` that returns True stops the JIT after it has worked out the
specialization (argument types, alignment, constants, options) and hands us that as JSON.
Worker processes (one per CPU, started once per process, no GPU needed) load the kernel's
source file and compile that specialization for the target it names into Triton's on-disk
cache (``JITFunction.preload``'s work, minus asking a driver for the device); the real
launches then find it there, under exactly the key they look up. Anything that fails here
is left to the launch, which compiles it as before, so this only ever saves time.

Variants compiled once are remembered (``$HLOTK_CACHE_DIR/triton/compiled.txt``, by kernel
hash, config, device and Triton version), so a warm process starts no pool at all.

When: ``start_for(variants)`` is called as soon as an executable's kernels are known (end of
codegen, before its first call: the workers import Triton while the arena, the constants
and the native launcher are prepared) and starts one worker per variant not yet compiled,
``pool_size()`` at most; none for ``INLINE_MAX`` variants or fewer (compiling those at
their launches costs less than starting processes). The pool lives as long as the process
and serves every later compile. The workers (``compile_worker.py``) import only Triton.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from codegen.cache import cache_root

from . import triton_key

_POOL: Optional["WorkerPool"] = None
_DONE: Optional[set[str]] = None
# What the pool did in this process (benchmarks/compile_time.py reports it): workers
# started, seconds spent starting them, jobs run, the sum and the longest of their
# seconds (each from sending the job to its answer, so a worker's start-up counts in its
# first job), and the wall seconds of ``run``.
STATS: dict[str, float] = {"workers": 0, "start_s": 0.0, "jobs": 0, "job_s": 0.0,
                           "job_max_s": 0.0, "wall_s": 0.0}


INLINE_MAX = 2       # this many new variants or fewer: no pool, the launches compile them
WORKER = Path(__file__).with_name("compile_worker.py")


def pool_size() -> int:
    """Workers at most: one per CPU (a compile is one busy core), 32 at most."""
    return max(1, min(32, os.cpu_count() or 1))


class WorkerPool:
    """Compile workers: ``compile_worker.py`` processes reading one JSON job per line and
    answering ``ok``/``error ...``. Plain subprocesses, not multiprocessing: spawn would
    re-import the user's ``__main__`` script in every worker. Started by file path (not
    ``-m``), so a worker imports Triton and nothing of hlotk."""

    def __init__(self) -> None:
        self.root = str(Path(__file__).resolve().parents[2])
        self.env = dict(os.environ)
        self.env.pop(triton_key.ENV, None)
        self.env["PYTHONPATH"] = self.root + (os.pathsep + self.env["PYTHONPATH"]
                                              if self.env.get("PYTHONPATH") else "")
        self.procs: list[subprocess.Popen] = []
        self.lock = threading.Lock()
        self.running = threading.Lock()     # one ``run`` at a time feeds the workers

    def grow(self, jobs: int) -> None:
        """Start workers up to one per job, ``pool_size()`` at most."""
        t0 = time.perf_counter()
        while len(self.procs) < min(jobs, pool_size()):
            STATS["workers"] += 1
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", _LAUNCH, str(WORKER)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                env=triton_key.worker_env(self.env),
                cwd=self.root))
        STATS["start_s"] += time.perf_counter() - t0

    def run(self, jobs: list[tuple[str, str, str]]) -> list[bool]:
        """Each job on some worker; True where it compiled."""
        with self.running:
            return self._run(jobs)

    def _run(self, jobs: list[tuple[str, str, str]]) -> list[bool]:
        t_run = time.perf_counter()
        self.grow(len(jobs))
        results = [False] * len(jobs)
        todo = list(enumerate(jobs))

        def feed(proc: subprocess.Popen) -> None:
            while True:
                with self.lock:
                    if not todo:
                        return
                    k, job = todo.pop(0)
                t0 = time.perf_counter()
                try:
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write(json.dumps(job) + "\n")
                    proc.stdin.flush()
                    results[k] = proc.stdout.readline().strip() == "ok"
                    dt = time.perf_counter() - t0
                    with self.lock:
                        STATS["jobs"] += 1
                        STATS["job_s"] += dt
                        STATS["job_max_s"] = max(STATS["job_max_s"], dt)
                except (OSError, ValueError, AssertionError):
                    return              # a dead worker: the others take the rest
        threads = [threading.Thread(target=feed, args=(p,), daemon=True) for p in self.procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        STATS["wall_s"] += time.perf_counter() - t_run
        return results

    def close(self) -> None:
        for p in self.procs:
            try:
                if p.stdin is not None:
                    p.stdin.close()
                p.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                p.kill()
            if p.stdout is not None:
                p.stdout.close()


# How a worker starts: its file loaded by path, so that neither ``codegen/__init__`` (numpy,
# hlo) nor the script's own directory (module names like ``kernel``) comes into it.
_LAUNCH = ("import importlib.util as u, sys; s = u.spec_from_file_location("
           "'hlotk_compile_worker', sys.argv[1]); m = u.module_from_spec(s); "
           "s.loader.exec_module(m); m.main()")


def _pool() -> WorkerPool:
    global _POOL
    if _POOL is None:
        _POOL = WorkerPool()
        atexit.register(_POOL.close)
    return _POOL


def _done_path():
    return cache_root() / "triton" / "compiled.txt"


def _done() -> set[str]:
    global _DONE
    if _DONE is None:
        try:
            _DONE = set(_done_path().read_text().split())
        except OSError:
            _DONE = set()
    return _DONE


def _mark(keys: list[str]) -> None:
    _done().update(keys)
    try:
        path = _done_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write("".join(k + "\n" for k in keys))
    except OSError:
        pass


def variant_key(kernel: Any, config: dict) -> str:
    from .autotune import tuning_key
    cfg = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return tuning_key(kernel.key).replace(" ", "_") + "|" + cfg


def _split(config: dict) -> tuple[dict, int, int]:
    cfg = dict(config)
    return cfg, cfg.pop("num_warps", 4), cfg.pop("num_stages", 1)


def _specialization(kernel: Any, args: list, config: dict) -> Optional[str]:
    """What Triton would compile for this launch (its ``specialization_data`` JSON), or
    None when it has that variant in memory already."""
    from triton import knobs
    seen: list[str] = []

    def hook(*, compile: dict, **_: Any) -> bool:
        seen.append(compile["specialization_data"])
        return True          # stop here: the pool compiles it
    old = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    try:
        cfg, warps, stages = _split(config)
        kernel.fn.warmup(*args, grid=kernel.plan.grid(dict(cfg)), **cfg,
                         num_warps=warps, num_stages=stages)
    finally:
        knobs.runtime.jit_cache_hook = old
    return seen[0] if seen else None


def start_for(variants: list[tuple[Any, dict]], extra: int = 0) -> int:
    """Start (in the background: processes, not waited for) one worker per (kernel,
    config) not compiled before, plus ``extra`` where there is any (launches known only at
    the first call: flash-attention candidates), ``pool_size()`` at most; none for ``INLINE_MAX`` or fewer
    unless a pool runs already. Returns how many variants are new."""
    new = len({variant_key(k, c) for k, c in variants} - _done())
    new += extra if new else 0       # all generated kernels known: a warm run, most likely
    if new > INLINE_MAX or (new and _POOL is not None):
        _pool().grow(new)
    return new


_COLLECTING: list[list[tuple[str, str, str]]] = []


def collecting_now() -> bool:
    """Inside ``collecting()``: launches are recorded, not run."""
    return bool(_COLLECTING)


@contextlib.contextmanager
def collecting() -> Iterator[list[tuple[str, str, str]]]:
    """Inside, a launch of a ``@triton.jit`` function that this process has not compiled
    yet neither compiles nor runs: Triton's JIT stops after working out the specialization
    (``jit_cache_hook``) and that becomes a pool job ``("module:" + module, name, data)``
    (the worker imports the module by name). For hand-written kernels launched from code
    (flash attention's candidates, ``codegen/triton/attention.py``), so that they compile
    in the pool with the generated kernels instead of one after another at their launches.
    Only launches whose results nobody reads may run inside (the caller's outputs are
    scratch)."""
    from triton import knobs
    jobs: list[tuple[str, str, str]] = []

    def hook(*, compile: dict, fn: Any = None, **_: Any) -> bool:
        data = compile["specialization_data"]
        # Triton passes (module, name) beside the data; newer ones also name it in the data.
        module, name = getattr(fn, "module", None), getattr(fn, "name", None)
        if not module or not name:
            try:
                module, _, name = str(json.loads(data)["name"]).rpartition(".")
            except (ValueError, KeyError, TypeError):
                return True          # not ours to compile: the real launch compiles it
        if module and name and "." not in name:
            jobs.append(("module:" + module, name, data))
        return True
    old = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    _COLLECTING.append(jobs)
    try:
        yield jobs
    finally:
        _COLLECTING.pop()
        knobs.runtime.jit_cache_hook = old


def spec_key(data: str) -> str:
    """The ``compiled.txt`` key of a collected launch: its specialization (kernel name,
    signature, constants, options, target) and this Triton's version."""
    from .autotune import triton_version
    return "spec|" + hashlib.sha256(data.encode()).hexdigest()[:32] + "|" + triton_version()


def precompile(jobs: list[tuple[Any, list, dict]],
               collected: Optional[list[tuple[str, str, str]]] = None) -> dict[str, int]:
    """Compile each (kernel, launch arguments, config), and each ``collected`` launch
    (``collecting()``), in the process pool. Returns counts: ``compiled`` (in the pool),
    ``known`` (compiled by an earlier process), ``failed`` (left to the launch), ``inline``
    (so few that the launches compile them, no pool started)."""
    stats = {"compiled": 0, "known": 0, "failed": 0, "inline": 0}
    pending: dict[str, tuple[str, str, str]] = {}
    keys: dict[str, str] = {}
    for job in collected or []:
        vkey = spec_key(job[2])
        if vkey in _done() or job[2] in pending:
            stats["known"] += job[2] not in pending
            continue
        pending[job[2]] = job
        keys[job[2]] = vkey
    for kernel, args, config in jobs:
        vkey = variant_key(kernel, config)
        if vkey in _done() or vkey in keys.values():
            stats["known"] += 1
            continue
        try:
            data = _specialization(kernel, args, config)
        except Exception:  # noqa: BLE001  (the launch will say what is wrong)
            stats["failed"] += 1
            continue
        if data is None:
            stats["known"] += 1
            continue
        pending[data] = (str(kernel.path), kernel.name, data)
        keys[data] = vkey
    if not pending:
        return stats
    if len(pending) <= INLINE_MAX and _POOL is None:
        stats["inline"] = len(pending)      # left to the launches: cheaper than a pool
        return stats
    datas = list(pending)
    done = _pool().run([pending[d] for d in datas])
    ok = [keys[d] for d, good in zip(datas, done) if good]
    stats["compiled"] += len(ok)
    stats["failed"] += len(datas) - len(ok)
    _mark(ok)
    return stats

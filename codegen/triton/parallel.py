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

When: a few workers start early (``start_early``: at ``import runtime`` on a GPU machine and
when the CUDA client is made), each warming up with a small compile while the program is
traced; ``start_for(variants)``, as soon as an executable's kernels are known (end of
codegen), grows the pool to one worker per variant not yet compiled, ``pool_size()`` at
most; with no pool yet, none for ``INLINE_MAX`` variants or fewer (compiling those at their
launches costs less than starting processes). A job goes to a worker that has finished its
start-up; while none has, this process compiles jobs itself. ``precompile`` hands the
workers each job as soon as Triton has told it the job's specialization. The pool lives as
long as the process and serves every later compile; its workers (``compile_worker.py``)
import only Triton and compile without a CUDA context. i13-cold's device runs found where a
job's seconds went (benchmarks/compile_time.md): Triton's compile is 0.05-0.2 s; a worker
that asked Triton's real driver for the device paid ~3-5 s of torch import and CUDA start.
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
from typing import Any, Callable, Iterable, Iterator, Optional

from codegen.cache import cache_root

from . import triton_key

_POOL: Optional["WorkerPool"] = None
_DONE: Optional[set[str]] = None
# What the pool did in this process (benchmarks/compile_time.py reports it): workers
# started, seconds spent starting them, jobs run (in a worker or, ``inproc``, in this
# process while the workers start), the sum and the longest of their seconds (each from
# taking the job to its answer), the wall seconds of ``run``, and the seconds of asking
# Triton for each job's specialization (``spec_s``). ``log``: one record per job (where it
# ran, seconds waiting, loading, compiling per Triton stage, answering); ``ready``: each
# worker's start-up (spawn, imports, key, warm-up compile).
STATS: dict[str, Any] = {"workers": 0, "early": 0, "early_from": "", "start_s": 0.0,
                         "jobs": 0, "inproc": 0, "job_s": 0.0, "job_max_s": 0.0,
                         "wall_s": 0.0, "spec_s": 0.0, "log": [], "ready": []}


INLINE_MAX = 2       # this many new variants or fewer and no pool: the launches compile them
WORKER = Path(__file__).with_name("compile_worker.py")
_OFF = ("0", "off", "false", "no")


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))     # what this process may use, not the host's
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pool_size() -> int:
    """Workers at most: ``HLOTK_COMPILE_WORKERS`` (0: no pool, kernels compile at their
    launches), else one per CPU this process may use but one (this process compiles too,
    ``inproc_enabled``), 32 at most."""
    env = os.environ.get("HLOTK_COMPILE_WORKERS", "").strip()
    if env:
        try:
            return max(0, int(env))
        except ValueError:
            from .elemental import TritonCodegenError
            raise TritonCodegenError(f"HLOTK_COMPILE_WORKERS={env!r}: expected a number of "
                                     "compile worker processes (0: none)") from None
    return max(1, min(32, _cpus() - 1))


def early_size() -> int:
    """Workers started before any job is known (``start_early``): ``HLOTK_COMPILE_EARLY``
    (0 turns the early start off), else 4, ``pool_size()`` at most. Few: a one-kernel
    program needs no more, and a bigger one grows the pool when its kernels are known."""
    env = os.environ.get("HLOTK_COMPILE_EARLY", "").strip().lower()
    if env in _OFF:
        return 0
    try:
        n = int(env) if env else 4
    except ValueError:
        n = 4
    return max(0, min(n, pool_size()))


def job_timeout() -> float:
    """Seconds a worker may spend on one job before it is killed and the job left to the
    launch (``HLOTK_COMPILE_TIMEOUT``, default 600: Triton's compiles here take 0.05-1 s)."""
    try:
        return max(0.1, float(os.environ.get("HLOTK_COMPILE_TIMEOUT", "600")))
    except ValueError:
        return 600.0


def inproc_enabled() -> bool:
    """Whether this process compiles jobs too while its workers start and work
    (``HLOTK_COMPILE_INPROCESS``, default on)."""
    return os.environ.get("HLOTK_COMPILE_INPROCESS", "1").strip().lower() not in _OFF


class _Worker:
    """One compile worker process; a thread reads its ``ready`` line (what its start-up
    took) as soon as it comes, so that a job is only ever given to a worker that is ready."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.ready: Optional[dict] = None
        self.ready_event = threading.Event()
        self.dead = False
        self.busy = False
        self.job_started = 0.0        # perf_counter of the job it works on (the watchdog's)
        threading.Thread(target=self._read_ready, daemon=True,
                         name="hlotk-compile-worker-ready").start()

    def _read_ready(self) -> None:
        try:
            line = self.proc.stdout.readline() if self.proc.stdout is not None else ""
        except (OSError, ValueError):
            line = ""
        if line.startswith("ready"):
            try:
                info = json.loads(line[5:] or "{}")
            except ValueError:
                info = {}
            info["read_at"] = time.time()
            self.ready = info
            STATS["ready"].append(info)
        else:
            self.dead = True        # exited before its start-up finished: never given a job
        self.ready_event.set()


class WorkerPool:
    """Compile workers: ``compile_worker.py`` processes reading one JSON job per line and
    answering ``ok``/``error ...`` (after a ``ready`` line at start). Plain subprocesses,
    not multiprocessing: spawn would re-import the user's ``__main__`` script in every
    worker. Started by file path (not ``-m``), so a worker imports Triton and nothing of
    hlotk. A job goes to the first worker that is ready (one that is still starting takes
    none), and, where ``inproc_enabled``, to this process's own thread meanwhile."""

    def __init__(self) -> None:
        self.root = str(Path(__file__).resolve().parents[2])
        self.env = dict(os.environ)
        self.env.pop(triton_key.ENV, None)
        self.env["PYTHONPATH"] = self.root + (os.pathsep + self.env["PYTHONPATH"]
                                              if self.env.get("PYTHONPATH") else "")
        self.workers: list[_Worker] = []
        self.lock = threading.Lock()
        self.running = threading.Lock()     # one ``run`` at a time feeds the workers
        self.target = ""                    # "backend,arch,warp" for warm-up compiles

    @property
    def procs(self) -> list[subprocess.Popen]:
        return [w.proc for w in self.workers]

    def grow(self, jobs: int, warm: str = "import") -> None:
        """Start workers up to one per job, ``pool_size()`` at most. ``warm="compile"``:
        each compiles a small kernel before saying ready (for workers started before
        their jobs are known: their first job then skips Triton's lazy start-up)."""
        t0 = time.perf_counter()
        with self.lock:
            while len(self.workers) < min(jobs, pool_size()):
                STATS["workers"] += 1
                env = triton_key.worker_env(self.env)
                env.update(HLOTK_WORKER_T0=repr(time.time()), HLOTK_WORKER_WARM=warm)
                if self.target:
                    env["HLOTK_WORKER_TARGET"] = self.target
                self.workers.append(_Worker(subprocess.Popen(
                    [sys.executable, "-c", _LAUNCH, str(WORKER)], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                    cwd=self.root)))
        STATS["start_s"] += time.perf_counter() - t0

    def run(self, jobs: list[tuple[str, ...]],
            fns: Optional[list[Any]] = None) -> list[bool]:
        """Each job on some worker (or in this process, with ``fns[k]`` the job's
        ``@triton.jit`` function where the caller has it); True where it compiled."""
        return self.run_stream(zip(jobs, fns or [None] * len(jobs)), len(jobs),
                               here=fns is not None)

    def run_stream(self, source: Iterable[tuple[tuple[str, ...], Any]], expected: int,
                   here: bool = True, idle: Optional[Callable[[], Any]] = None) -> list[bool]:
        """Like ``run``, for (job, fn) pairs that ``source`` yields while the workers
        already compile the earlier ones (the caller works out each job's specialization,
        ~10 ms each, as the jobs go); ``expected``: how many at most (the pool grows to
        that). Results in ``source``'s order. ``idle``: called once the jobs are given,
        before the wait for their answers."""
        with self.running:
            return self._run(source, expected, here, idle)

    def _run(self, source: Iterable[tuple[tuple[str, ...], Any]], expected: int,
             here: bool, idle: Optional[Callable[[], Any]] = None) -> list[bool]:
        t_run = time.perf_counter()
        self.grow(expected)
        jobs: list[tuple[str, ...]] = []
        fns: list[Any] = []
        results: list[bool] = []
        todo: list[int] = []
        left = [0]                        # jobs given and not finished (compiled or failed)
        producing = [True]                # the caller may still add jobs
        finished = threading.Condition(self.lock)

        def done(k: int, rec: dict, dt: float) -> None:
            rec["total"] = dt
            with finished:
                STATS["jobs"] += 1
                STATS["job_s"] += dt
                STATS["job_max_s"] = max(STATS["job_max_s"], dt)
                STATS["log"].append(rec)
                left[0] -= 1
                finished.notify_all()

        def next_job(w: _Worker) -> Optional[int]:
            with finished:
                while not todo and producing[0]:
                    finished.wait(0.05)
                k = todo.pop(0) if todo else None
                w.job_started = time.perf_counter()     # with busy, under the lock: the
                w.busy = k is not None                  # watchdog never sees a stale start
                return k

        def feed(w: _Worker, index: int) -> None:
            # A worker still starting takes no job; it stops waiting once all are done.
            while not w.ready_event.wait(0.02):
                if left[0] <= 0 and not producing[0]:
                    return
            if w.dead or w.proc.stdin is None or w.proc.stdout is None:
                return
            while True:
                k = next_job(w)
                if k is None:
                    return
                t0, sent = time.perf_counter(), time.time()
                try:
                    w.proc.stdin.write(json.dumps(jobs[k]) + "\n")
                    w.proc.stdin.flush()
                    answer = w.proc.stdout.readline()
                except (OSError, ValueError):
                    answer = ""
                if not answer:              # the worker died: this job is left to the launch
                    why = "the worker exited" if not w.dead else \
                        f"killed after {job_timeout():.0f} s (HLOTK_COMPILE_TIMEOUT)"
                    w.dead = True
                    done(k, {"w": index, "ok": False, "error": why}, time.perf_counter() - t0)
                    return
                results[k] = answer.startswith("ok")
                rec: dict[str, Any] = {"w": index, "ok": results[k]}
                if results[k]:
                    try:
                        rec.update(json.loads(answer[2:] or "{}"))
                        rec["queue"] = rec.pop("recv_at") - sent
                        rec["answer"] = time.time() - rec.pop("done_at")
                    except (ValueError, KeyError, TypeError):
                        pass
                else:
                    rec["error"] = answer[6:200].strip()
                w.busy = False
                done(k, rec, time.perf_counter() - t0)
        threads = [threading.Thread(target=feed, args=(w, i), daemon=True)
                   for i, w in enumerate(self.workers) if not w.dead]
        for t in threads:
            t.start()
        try:
            for job, fn in source:
                with finished:
                    jobs.append(job)
                    fns.append(fn)
                    results.append(False)
                    todo.append(len(jobs) - 1)
                    left[0] += 1
                    finished.notify_all()
        finally:
            with finished:
                producing[0] = False
                finished.notify_all()
        if here and inproc_enabled():
            def take_here() -> Optional[int]:
                # Only while no worker is ready: this process's first compile pays Triton's
                # start-up (~1 s), so once workers answer, it would be the last to finish.
                with self.lock:
                    if any(w.ready_event.is_set() and not w.dead for w in self.workers):
                        return None
                    return todo.pop(0) if todo else None
            self._compile_here(jobs, fns, take_here, done, results)
        if idle is not None:
            try:
                idle()
            except Exception:  # noqa: BLE001  (the caller's own work, not the compiles')
                pass
        limit = job_timeout()
        with finished:
            # Until every job is answered, or nobody is left to answer (then: the launches).
            while left[0] > 0 and any(t.is_alive() for t in threads):
                finished.wait(0.05)
                now = time.perf_counter()
                for w in self.workers:
                    # A job past the limit (a hung compiler): the worker is killed, its
                    # feed thread reads the end of its output and leaves the job to the launch.
                    if w.busy and not w.dead and now - w.job_started > limit:
                        w.dead = True
                        w.proc.kill()
        STATS["wall_s"] += time.perf_counter() - t_run
        return results

    def _compile_here(self, jobs, fns, take, done, results) -> None:
        """This thread compiles jobs too (the caller waits anyway): Triton's own
        ``preload`` of the specialization the launch will ask for (this process has the
        real driver and its CUDA context already), into the same cache and the function's
        in-memory kernel cache."""
        from .compile_worker import compile_specialization
        while True:
            k = take()
            if k is None:
                return
            t0 = time.perf_counter()
            rec: dict[str, Any] = {"w": "main", "ok": True}
            try:
                fn = fns[k] if fns[k] is not None else _load_module_fn(jobs[k])
                try:
                    fn.preload(jobs[k][2])
                except Exception as e:  # noqa: BLE001  (another Triton's format)
                    rec["preload_error"] = f"{type(e).__name__}: {e}"[:200]
                    compile_specialization(fn, *jobs[k][2:])
                results[k] = True
            except Exception as e:  # noqa: BLE001  (left to the launch, which reports it)
                rec.update(ok=False, error=f"{type(e).__name__}: {e}"[:200])
            dt = time.perf_counter() - t0
            rec["total"] = rec["compile"] = dt
            STATS["inproc"] += 1
            done(k, rec, dt)

    def close(self) -> None:
        """End every worker: end of input first (an idle worker exits at once), then,
        after a short wait, terminate what is still busy (a warm-up compile), so that no
        process outlives this one and none is left unreaped."""
        for w in self.workers:
            try:
                if w.proc.stdin is not None:
                    w.proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        for w in self.workers:
            try:
                w.proc.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.terminate()
                try:
                    w.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    w.proc.kill()
                    w.proc.wait()
            if w.proc.stdout is not None:
                w.proc.stdout.close()


def _load_module_fn(job: tuple[str, ...]) -> Any:
    """The ``@triton.jit`` function a job names, in this process."""
    from .compile_worker import load_fn
    return load_fn(job[0], job[1])


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
    """One Triton compile: the kernel's source (its content key), the config, and what
    else its specialization depends on (``TritonKernel.variant_tag``: a flat kernel of
    several sizes is one source, compiled once per class of its element count)."""
    from .autotune import tuning_key
    cfg = json.dumps(config, sort_keys=True, separators=(",", ":"))
    tag = getattr(kernel, "variant_tag", "")
    return tuning_key(kernel.key).replace(" ", "_") + "|" + cfg + (f"|{tag}" if tag else "")


def compile_weight(kernel: Any, config: dict) -> float:
    """A rough rank of how long Triton takes to compile ``kernel`` with ``config``: its
    source's size (the ops it emits; hand-written kernels loaded by module count as large)
    times the square root of the elements each thread holds (LLVM and ptxas work grows with
    the unrolled code). Only the order of the pool's jobs depends on it."""
    try:
        size = float(os.path.getsize(kernel.path))
    except (OSError, TypeError, AttributeError):
        size = 1e6
    block = 1
    for name, value in config.items():
        if name.startswith("BLOCK") and isinstance(value, int):
            block *= value
    per_thread = max(1.0, block / (32.0 * int(config.get("num_warps", 4))))
    return size * per_thread ** 0.5


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
    the first call: flash-attention candidates), ``pool_size()`` at most; none for
    ``INLINE_MAX`` or fewer unless a pool runs already. Returns how many variants are new."""
    new = len({variant_key(k, c) for k, c in variants} - _done())
    new += extra if new else 0       # all generated kernels known: a warm run, most likely
    if pool_size() and (new > INLINE_MAX or (new and _POOL is not None)):
        _pool().grow(new)
    return new


def current_target() -> str:
    """This process's Triton target as JSON (what its launches compile for), "" where
    Triton has no active driver: a worker compiles a job for the target its
    specialization names, else for this one (Triton 3.6's specialization has none)."""
    try:
        import dataclasses

        from triton.runtime.driver import driver

        from .direct_launch import install_driver
        # Triton's own driver would gcc-build its cuda_utils here on a cold cache (~0.3 s
        # of i13-warm's softmax pool phase): the direct launch's driver answers from torch
        install_driver()
        return json.dumps(dataclasses.asdict(driver.active.get_current_target()))
    except Exception:  # noqa: BLE001  (the worker then needs the target in the data)
        return ""


def start_early(target: str = "", where: str = "") -> int:
    """Start ``early_size()`` workers now, before any kernel is known (``import runtime`` on
    a GPU machine, ``runtime.jit(..., backend="cuda")``), each warming up with a small
    compile for ``target`` ("backend,arch,warp_size"; default sm_90) while the program is
    traced and optimized; their first jobs then skip Triton's start-up. Returns how many
    workers the pool has."""
    n = early_size()
    if n <= 0 or _interpreting():
        return len(_POOL.workers) if _POOL is not None else 0
    if "triton" in sys.modules:
        try:        # Triton's key from the machine cache (~3 ms): the workers skip its hash
            triton_key.install(compute=False)
        except Exception:  # noqa: BLE001  (each worker hashes it: 0.4 s of its start-up)
            pass
    pool = _pool()
    if target:
        pool.target = target
    before = len(pool.workers)
    pool.grow(n, warm="compile")
    STATS["early"] += len(pool.workers) - before
    if len(pool.workers) > before:        # benchmarks: when and from where they started
        STATS["early_from"] = f"{where} at {time.time():.3f}"
    return len(pool.workers)


def _interpreting() -> bool:
    v = os.environ.get("TRITON_INTERPRET")
    return v is not None and v not in ("0", "false", "False", "no", "off")


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
               collected: Optional[list[tuple[str, str, str]]] = None,
               idle: Optional[Callable[[], Any]] = None) -> dict[str, int]:
    """Compile each (kernel, launch arguments, config), and each ``collected`` launch
    (``collecting()``), in the process pool. Returns counts: ``compiled`` (in the pool),
    ``known`` (compiled by an earlier process), ``failed`` (left to the launch), ``inline``
    (so few that the launches compile them, no pool started). The workers start on the
    first jobs while this process still asks Triton for the later ones' specializations.
    ``idle``: called once every job is given to the pool, before waiting for the answers
    (the caller's deferred work: runtime/deferred.py)."""
    stats = {"compiled": 0, "known": 0, "failed": 0, "inline": 0}
    fresh: list[tuple[str, str, str]] = []        # collected launches not compiled before
    seen: set[str] = set()
    for job in collected or []:
        if spec_key(job[2]) in _done() or job[2] in seen:
            stats["known"] += job[2] not in seen
            continue
        seen.add(job[2])
        fresh.append(job)
    todo: list[tuple[Any, list, dict, str]] = []   # generated variants not compiled before
    vkeys: set[str] = set()
    for kernel, args, config in jobs:
        vkey = variant_key(kernel, config)
        if vkey in _done() or vkey in vkeys:
            stats["known"] += 1
            continue
        vkeys.add(vkey)
        todo.append((kernel, args, config, vkey))
    if not fresh and not todo:
        return stats
    # The longest compiles first: with more jobs than ready workers, a long one taken last
    # would end the pool alone (adam_step's three 4-parameter updates took 0.3 s each, its
    # small kernels 0.1; in a fixed order two of the long ones went second, pool 0.43 s).
    todo.sort(key=lambda job: -compile_weight(job[0], job[2]))
    keys: list[str] = []                          # each pool job's ``compiled.txt`` key

    def specialized():
        """(kernel, data, vkey) of each new variant, asking Triton as they are needed."""
        for kernel, args, config, vkey in todo:
            t0 = time.perf_counter()
            try:
                data = _specialization(kernel, args, config)
            except Exception:  # noqa: BLE001  (the launch will say what is wrong)
                stats["failed"] += 1
                data = ""
            STATS["spec_s"] += time.perf_counter() - t0
            if data is None or data in seen:
                stats["known"] += 1
            elif data:
                seen.add(data)
                yield kernel, data, vkey
    if (len(fresh) + len(todo) <= INLINE_MAX and _POOL is None) or not pool_size():
        # So few that the launches compile them (cheaper than starting workers).
        stats["inline"] = len(fresh) + sum(1 for _ in specialized())
        return stats
    target = current_target()

    def source():
        for job in fresh:
            keys.append(spec_key(job[2]))
            yield job + (target,), None
        for kernel, data, vkey in specialized():
            keys.append(vkey)
            yield (str(kernel.path), kernel.name, data, target), kernel.fn
    done = _pool().run_stream(source(), len(fresh) + len(todo), idle=idle)
    ok = [key for key, good in zip(keys, done) if good]
    stats["compiled"] += len(ok)
    stats["failed"] += len(done) - len(ok)
    _mark(ok)
    return stats

"""Compile time of the GPU suite (issue 13): hlotk's first call, cold and warm, per phase,
beside XLA's lower + compile of the same program in the same process.

    PYTHONUNBUFFERED=1 python3 -m benchmarks.compile_time [--only NAME,...] [--autotune 0|1|2]
        [--out benchmarks/compile_time.md]            # on a GPU: backend="cuda"
    python -m benchmarks.compile_time --deviceless    # no GPU: passes and codegen only
    python -m benchmarks.compile_time --interpret     # no GPU: the CUDA backend's lower and
        # compile under Triton's interpreter, the kernels' JIT objects, GC passes (i13-warm);
        # passes / other split as on the GPU (i13-passes); --heldout: the programs of
        # benchmarks/heldout_programs.py (AdamW, Lion, attention grad, 32k cross-entropy ...)
        [--machine-cache DIR | --machine-cold] [--cprofile]   # issue 14's programs by name

Before the programs, a "machine" step fills a fresh ``HLOTK_MACHINE_CACHE_DIR`` (the native
launcher library, Triton's installation key: once per machine) and reports its seconds;
``--machine-cold`` gives every program a fresh one instead (each cold row pays them).
``prewarm_wait`` is the first call's wait for runtime/cuda/prewarm.py's threads;
``--cprofile`` adds a third, warm run per program under cProfile (top functions in the JSON).

Each program runs in two fresh processes sharing one cache directory (hlotk's
``HLOTK_CACHE_DIR`` and Triton's ``TRITON_CACHE_DIR``, both empty before the first):
**cold** (nothing cached) and **warm** (a new process, caches filled by the cold one).
Phases, in seconds (the JSON beside the table has more: imports of jax/triton/hlotk, the
pool's per-job seconds, Triton's cache entries): ``import_torch``, ``cuda_init`` (torch's
CUDA context), ``init`` (the runtime's client; starts runtime/cuda/prewarm.py's thread),
``lower`` (trace, export, import), ``passes`` (the HLO pipeline, or reading the optimized
module from the cache), ``codegen`` (Triton source per fusion, library calls, thunks),
``other`` (buffer assignment, arena, constants), ``pool`` (every kernel and autotuning
candidate compiled at once by the compile workers, codegen/triton/parallel.py),
``jit_s`` (Triton's ``_do_compile``: a launch's lookup in Triton's cache, or its compile),
``load_s`` (``_init_handles``: loading binaries, building launchers), ``autotune`` (timing
candidate configs; HLOTK_AUTOTUNE level as given), ``warmup`` (the whole first run: pool,
JIT, loads, autotune, first launches), ``native`` (the native graph's captures and
patching), ``call_rest`` (the first call minus warmup and native: the native launcher's
library, JAX's jit of the FFI call), ``capture`` (the second call: since session 7 the first
call runs on the Python path and the second builds the native graph). ``first call`` = lower +
compile + the first call, after imports and device init (XLA's ``lower+compile`` is measured
the same way: after JAX's import and device init); ``fresh process`` adds the imports and
inits (XLA's: jax import + device init + lower + compile). XLA: ``jax.jit(f).lower(*a)
.compile()`` in the same process (XLA's persistent cache is off, so warm is a compile too).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, ".")

PHASES = ("import_hlotk", "early_wait", "init", "lower", "passes", "codegen", "other", "pool",
          "jit_s", "load_s", "autotune", "warmup", "native", "call_rest", "prewarm_wait",
          "capture")
# The pool's breakdown (issue 13, i13-cold), one line per row under the table: workers
# (started early / in all), jobs (compiled in this process), the median and longest job,
# the median job's Triton stages, the longest wait of a job in a worker's pipe, and the
# median worker's start-up (spawn, imports, Triton's key, warm-up compile).
POOL_COLS = ("workers", "early", "jobs", "inproc", "spec_s", "job_med", "job_max", "ir", "ttir",
             "ttgir", "llir", "ptx", "cubin", "launcher", "queue_max", "answer_max",
             "w_spawn", "w_import", "w_key", "w_warm", "w_ready_s")


def _program(name: str):
    from benchmarks.gpu_suite import programs
    from benchmarks.attention import suite_programs
    from benchmarks.heldout_programs import NAMES, programs as heldout
    for prog in programs() + suite_programs() + (heldout() if name in NAMES else []):
        if prog[0] == name:
            return prog
    raise SystemExit(f"unknown program {name!r}")


def child_machine() -> dict:
    """Once per machine (before any program): Triton's installation key hashed and stored,
    the native launcher library built, into ``HLOTK_MACHINE_CACHE_DIR``."""
    row: dict = {"name": "machine"}
    import jax  # noqa: F401
    import triton  # noqa: F401
    from codegen.triton import triton_key
    from runtime.cuda.native import build
    t0 = time.perf_counter()
    triton_key.install()
    row["triton_key"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        build()
    except Exception as e:  # noqa: BLE001
        row["native_error"] = str(e)[:300]
    row["native_build"] = time.perf_counter() - t0
    return row


def _hooks() -> dict:
    """Benchmark-only wrappers around Triton's JIT: seconds in ``_do_compile`` (a launch's
    compile, or its lookup in Triton's on-disk cache) and in ``_init_handles`` (loading a
    binary and building its launcher), and how many of each."""
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.jit import JITFunction
    acc = {"jit_s": 0.0, "jit_n": 0, "load_s": 0.0, "load_n": 0}

    def timed(orig, what: str, loaded_already=lambda self: False):
        def wrapper(self, *a, **k):
            if loaded_already(self):
                return orig(self, *a, **k)
            t0 = time.perf_counter()
            try:
                return orig(self, *a, **k)
            finally:
                acc[what + "_s"] += time.perf_counter() - t0
                acc[what + "_n"] += 1
        return wrapper
    compile_wrapper = timed(JITFunction._do_compile, "jit")
    load_wrapper = timed(CompiledKernel._init_handles, "load",
                         lambda self: getattr(self, "module", None) is not None)
    JITFunction._do_compile = compile_wrapper
    CompiledKernel._init_handles = load_wrapper
    return acc


def _library_hook() -> dict:
    """Host seconds of the first call's library-call thunks (cuDNN, cuBLAS: their
    set-up on first use), until ``stop()``: sum ``s``, count ``n``, longest ``max``."""
    from runtime.cuda.thunks import LibraryThunk
    out: dict = {"s": 0.0, "n": 0, "max": 0.0}
    orig = LibraryThunk.run

    def run(self, mem, ctx):
        t0 = time.perf_counter()
        try:
            return orig(self, mem, ctx)
        finally:
            dt = time.perf_counter() - t0
            out["s"] += dt
            out["n"] += 1
            out["max"] = max(out["max"], dt)

    def stop() -> None:
        LibraryThunk.run = orig
    LibraryThunk.run = run
    out["stop"] = stop
    return out


def _cache_entries() -> int:
    try:
        return len(os.listdir(os.environ.get("TRITON_CACHE_DIR", "")))
    except OSError:
        return 0


def _cache_kinds() -> dict:
    """Triton's cache directory by what its entries hold: kernels (a cubin), compiled
    launchers or utilities (a shared library), anything else."""
    root = os.environ.get("TRITON_CACHE_DIR", "")
    kinds = {"cubin": 0, "so": 0, "other": 0}
    try:
        for d in os.listdir(root):
            names = os.listdir(os.path.join(root, d))
            kind = "cubin" if any(n.endswith(".cubin") for n in names) else \
                "so" if any(n.endswith(".so") for n in names) else "other"
            kinds[kind] += 1
    except OSError:
        pass
    return kinds


def child_gpu(name: str, level: str) -> dict:
    row: dict = {"name": name}
    clock = time.perf_counter
    t0 = clock()
    import jax
    row["import_jax"] = clock() - t0
    t0 = clock()
    import torch
    row["import_torch"] = clock() - t0
    t0 = clock()
    import triton  # noqa: F401
    row["import_triton"] = clock() - t0
    os.environ["HLOTK_AUTOTUNE"] = level
    t0 = clock()
    import runtime
    from codegen.triton import autotune, parallel
    from runtime.cuda import executable_of
    from runtime.cuda.backend import CudaExecutable
    row["import_hlotk"] = clock() - t0
    row["runtime_imported_at"] = time.time()    # beside the pool's ``early_from`` stamp
    fn, args = _program(name)[2:4]
    t0 = clock()
    dev_args = jax.device_put(args)
    jax.block_until_ready(dev_args)
    row["jax_init"] = clock() - t0           # JAX's backend and device, the inputs' copy
    t0 = clock()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    row["cuda_init"] = clock() - t0          # torch's CUDA context
    # The compile pool's early workers (started by ``import runtime`` on a GPU machine)
    # finish their start-up before XLA is timed, so that they do not share the CPU with
    # XLA's compile; the wait is reported (``early_wait``) and counted in hlotk's fresh
    # process, never in its first call. HLOTK_CT_SETTLE=0: no wait.
    row["early_wait"] = _settle(parallel) if os.environ.get("HLOTK_CT_SETTLE", "1") == "1" \
        else 0.0
    t0 = clock()
    xc = jax.jit(fn).lower(*dev_args).compile()
    row["xla"] = clock() - t0
    want = jax.block_until_ready(xc(*dev_args))
    t0 = clock()
    from runtime.jit import default_client
    default_client("cuda")                    # the runtime's client: once per process
    row["init"] = clock() - t0
    acc = _hooks()
    lib = _library_hook()
    warm: list[float] = []
    first_run = CudaExecutable.first_run

    @contextlib.contextmanager
    def timed_first_run(self, mem):
        t = clock()
        with first_run(self, mem):
            yield
        torch.cuda.synchronize()
        warm.append(clock() - t)
    CudaExecutable.first_run = timed_first_run
    entries0 = _cache_entries()
    modules0 = set(sys.modules)
    gc_log = _gc_watch()
    profiler = None
    if os.environ.get("HLOTK_CT_CPROFILE") == "1":
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    t0 = clock()
    lowered = runtime.jit(fn, backend="cuda").lower(*dev_args)
    t1 = clock()
    compiled = lowered.compile()
    t2 = clock()
    exe = executable_of(compiled)
    entries1 = _cache_entries()
    got = jax.block_until_ready(compiled(*dev_args))
    t3 = clock()
    lib["stop"]()
    row["lib_s"], row["lib_n"], row["lib_max"] = lib["s"], lib["n"], lib["max"]
    row["library_warm"] = dict(exe.stats.get("library_warm", {}))
    native_first = getattr(exe, "native", None)    # None: the first call took the Python path
    gc_log["stop"]()
    # Modules the first call imported (compiled from source where no bytecode is kept).
    new_modules = sorted(m for m in set(sys.modules) - modules0
                         if not m.startswith("hlotk_triton_"))
    row["first_call_imports"] = [len(new_modules), new_modules[:150]]
    row["gc"], row["gc_n"], row["gc_full"] = gc_log["s"], gc_log["n"], gc_log["full"]
    row["gc_objects"] = gc_log["objects"]
    row["gc_frozen"] = __import__("gc").get_freeze_count()
    if profiler is not None:
        import io
        import pstats
        profiler.disable()
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("cumulative").print_stats(45)
        row["cprofile"] = buf.getvalue()[-9000:]
    jax.block_until_ready(compiled(*dev_args))
    t4 = clock()
    records = compiled.executable.pass_records
    row["lower"] = t1 - t0
    hit = getattr(compiled.executable, "module_cache_hit", False)
    row["passes"] = (t2 - t1) - exe.build_seconds if hit or not records else \
        sum(r.seconds for r in records)
    row["module_cache_hit"] = hit
    row["codegen"] = exe.build_seconds
    row["other"] = max(0.0, (t2 - t1) - row["passes"] - row["codegen"])
    row["autotune"] = autotune.SECONDS["tune"] - autotune.SECONDS["tune_compile"]
    row["pool"] = exe.stats.get("precompile_s", 0.0)
    row["warmup"] = sum(warm)                # the first run: pool, autotune, first launches
    row.update(acc)
    native = native_first
    row["native"] = getattr(native, "build_seconds", 0.0) - row["warmup"] if native else 0.0
    row["native_path"] = getattr(exe, "native_reason", "")
    row["triton"] = (t3 - t2) - row["autotune"] - row["pool"]
    row["call_rest"] = (t3 - t2) - row["warmup"] - max(row["native"], 0.0)
    row["capture"] = t4 - t3
    row["first_call"] = t3 - t0
    row["fresh_process"] = t3 - t0 + row["init"] + row["cuda_init"] + row["import_torch"] \
        + row["import_triton"] + row["import_hlotk"] + row["import_jax"] + row["jax_init"] \
        + row["early_wait"]
    row["xla_fresh_process"] = row["xla"] + row["import_jax"] + row["jax_init"]
    from codegen.triton import triton_key
    from runtime.cuda import prewarm
    row["prewarm_wait"] = prewarm.STATS["wait_s"]
    row["prewarm"] = dict(prewarm.STATS)
    row["triton_key"] = dict(triton_key.STATS)
    row["precompile"] = exe.stats.get("precompile", {})
    row["pool_stats"] = dict(parallel.STATS)
    from codegen.triton import direct_launch
    # kernels launched through the CUDA driver / left to Triton's launcher (and why)
    row["direct_launch"] = {k: v for k, v in direct_launch.STATS.items()}
    row["launch_mode"] = direct_launch.mode()
    # HLOTK_LOOP_EMITTER=cuda: loop kernels made in CUDA C (NVRTC compiles: count, seconds
    # summed over the background threads, the longest), and the loop fusions kept on Triton
    from codegen.cuda_c import kernel as cuda_c_kernel, loop_emitter, nvrtc
    row["loop_emitter"] = loop_emitter()
    row["cuda_c"] = {**cuda_c_kernel.STATS, **{f"nvrtc_{k}": v for k, v in nvrtc.STATS.items()},
                     "declined": exe.stats.get("cuda_c_declined", [])[:20]}
    row.update(pool_summary(parallel.STATS))
    row["tuned_kernels"] = autotune.SECONDS["tuned_kernels"]
    row["triton_cache_new"] = [entries1 - entries0, _cache_entries() - entries1]
    row["triton_cache_kinds"] = _cache_kinds()
    if os.environ.get("HLOTK_CT_PROFILE") == "1":
        # Each kernel timed alone: recorded beside its prediction (calibration data).
        t0 = clock()
        exe.profile(list(jax.tree_util.tree_leaves(dev_args)), reps=5)
        row["profile_s"] = clock() - t0
    leaves = list(zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)))
    import numpy as np
    row["max_rel_err"] = max((float(np.linalg.norm(np.asarray(g, np.float64) - np.asarray(w, np.float64))
                                    / max(np.linalg.norm(np.asarray(w, np.float64)), 1e-30))
                              for g, w in leaves), default=0.0)
    row["leaves"] = len(leaves)
    return row


def _gc_watch() -> dict:
    """The cyclic collector's passes from now until ``stop()``: seconds (``s``), passes per
    generation (``n``), [start, seconds] of each full pass (``full``), and the objects it
    tracked at the start (``objects``; frozen ones are not tracked)."""
    import gc
    clock = time.perf_counter
    out: dict = {"s": 0.0, "n": [0, 0, 0], "full": [], "objects": len(gc.get_objects())}
    t0, start = clock(), [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            start[0] = clock()
            return
        took = clock() - start[0]
        out["s"] += took
        out["n"][info["generation"]] += 1
        if info["generation"] == 2:
            out["full"].append([round(start[0] - t0, 4), round(took, 4)])
    gc.callbacks.append(on_gc)

    def stop() -> None:
        if on_gc in gc.callbacks:
            gc.callbacks.remove(on_gc)
    out["stop"] = stop
    return out


def _settle(parallel, limit: float = 10.0) -> float:
    """Seconds until every early worker said ready (``limit`` at most)."""
    pool = parallel._POOL
    if pool is None:
        return 0.0
    t0 = time.perf_counter()
    for w in list(getattr(pool, "workers", [])):     # main's pool before i13-cold: none
        w.ready_event.wait(max(0.0, limit - (time.perf_counter() - t0)))
    return time.perf_counter() - t0


def _median(xs: list) -> float:
    xs = sorted(x for x in xs if isinstance(x, (int, float)))
    return xs[len(xs) // 2] if xs else 0.0


def pool_summary(stats: dict) -> dict:
    """The pool's per-job log and workers' start-ups as the POOL_COLS numbers."""
    log = [r for r in stats.get("log", []) if r.get("ok")]
    worker_jobs = [r for r in log if r.get("w") != "main"]
    out = {"workers": stats.get("workers", 0), "early": stats.get("early", 0),
           "jobs": stats.get("jobs", 0), "inproc": stats.get("inproc", 0),
           "spec_s": stats.get("spec_s", 0.0),
           "job_med": _median([r.get("total") for r in log]),
           "job_max": max([r.get("total", 0.0) for r in log], default=0.0),
           "queue_max": max([r.get("queue", 0.0) for r in worker_jobs], default=0.0),
           "answer_max": max([r.get("answer", 0.0) for r in worker_jobs], default=0.0),
           "launcher": _median([r.get("launcher") for r in worker_jobs])}
    for stage in ("ir", "ttir", "ttgir", "llir", "ptx", "cubin"):
        out[stage] = _median([r.get("stages", {}).get(stage) for r in worker_jobs])
    ready = stats.get("ready", [])
    out["w_spawn"] = _median([r.get("spawn") for r in ready])
    out["w_import"] = _median([r.get("import") for r in ready])
    out["w_key"] = _median([r.get("key") for r in ready])
    out["w_warm"] = _median([r.get("warm_compile") for r in ready])
    out["w_ready_s"] = _median([r.get("spawn", 0.0) + r.get("ready_at", 0.0) - r.get("t_start", 0.0)
                                for r in ready if "t_start" in r])
    via: dict = {}
    for r in log:
        via[r.get("via", r.get("w") == "main" and "main" or "?")] = \
            via.get(r.get("via", r.get("w") == "main" and "main" or "?"), 0) + 1
    out["via"] = via
    errs = [r[k] for r in log for k in ("preload_error", "direct_error", "launcher_error")
            if r.get(k)]
    if errs:
        out["compile_notes"] = sorted(set(errs))[:4]
    failed = [r.get("error", "") for r in stats.get("log", []) if not r.get("ok")]
    if failed:
        out["job_errors"] = failed[:5]
    return out


def child_worker_probe(count: int, warm: str) -> dict:
    """``count`` compile workers started at once, each compiling the warm-up kernel twice
    (``HLOTK_WORKER_WARM=compile2``): what a worker's start-up and a compile cost when that
    many run side by side (contention), with the parent's Triton key or without."""
    import subprocess as sp
    from codegen.triton import parallel, triton_key
    if warm == "key":
        import triton  # noqa: F401
        triton_key.install()
    env = triton_key.worker_env(dict(os.environ, PYTHONPATH=os.getcwd()))
    t0 = time.time()
    procs = [sp.Popen([sys.executable, "-c", parallel._LAUNCH, str(parallel.WORKER)],
                      stdin=sp.PIPE, stdout=sp.PIPE, stderr=sp.DEVNULL, text=True,
                      env=dict(env, HLOTK_WORKER_T0=repr(time.time()),
                               HLOTK_WORKER_WARM="compile2")) for _ in range(count)]
    infos = []
    for p in procs:
        line = p.stdout.readline()
        info = json.loads(line[5:]) if line.startswith("ready") else {"failed": line[:200]}
        info["ready_after"] = info.get("ready_at", t0) - t0
        infos.append(info)
        p.stdin.close()
        p.wait()
    keys = ("spawn", "import", "key", "warm_compile", "warm_compile2", "ready_after")
    row = {"name": f"probe x{count} ({warm})", "workers": infos}
    for k in keys:
        row[k] = _median([i.get(k) for i in infos])
        row[k + "_max"] = max([i.get(k, 0.0) for i in infos], default=0.0)
    return row


def child_deviceless(name: str) -> dict:
    import runtime
    from codegen.triton import compile_fusion
    fn, args = _program(name)[2:4]
    row: dict = {"name": name}
    t0 = time.perf_counter()
    lowered = runtime.jit(fn, pipeline="none").lower(*args)
    t1 = time.perf_counter()
    from passes.pipelines import pipeline_spec
    from passes.fusion.pass_ import with_target
    from runtime import compile_cache
    from runtime.tools import compile_module
    spec = with_target(pipeline_spec("default", "cuda"), "h200")
    module, records, hit = compile_cache.compiled(
        lowered.module, spec, "cuda", lambda m: compile_module(m, spec, backend="cuda")[0])
    t2 = time.perf_counter()
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode == "fusion":
                try:
                    compile_fusion(inst, target="h200")
                except Exception:  # noqa: BLE001  (such a fusion runs another way)
                    pass
    t3 = time.perf_counter()
    row.update(lower=t1 - t0, passes=t2 - t1, codegen=t3 - t2, first_call=t3 - t0,
               cache_hit=hit)
    return row


def child_interpret(name: str) -> dict:
    """The warm path's CPU work without a GPU (``--interpret``): the CUDA backend's lower and
    compile under Triton's interpreter (``TRITON_INTERPRET=1``, set by the parent), after
    the imports and XLA's compile of the same function as ``child_gpu`` does them, then
    ``kernels``: each Triton kernel's module imported and its JITFunctions built as a GPU
    process builds them (the interpreter switched off first). ``gc``: seconds of the cyclic
    collector's passes inside the timed steps (all generations)."""
    clock = time.perf_counter
    row: dict = {"name": name}
    t0 = clock()
    import jax
    import torch  # noqa: F401
    import triton  # noqa: F401
    row["import_jax_torch_triton"] = clock() - t0
    t0 = clock()
    import runtime
    from runtime.cuda import executable_of
    from runtime.cuda.backend import CudaExecutable  # noqa: F401  (as child_gpu imports it)
    if os.environ.get("HLOTK_CT_GPU_IMPORTS") == "1":
        # ``--env HLOTK_CT_GPU_IMPORTS=1``: what child_gpu imports before timing, too (its
        # codegen.triton is then not part of "other": i13-cpu2, benchmarks/NOTES.md)
        from codegen.triton import autotune, parallel  # noqa: F401
    row["import_hlotk"] = clock() - t0
    fn, args = _program(name)[2:4]
    jax.jit(fn).lower(*args).compile()
    from runtime.jit import default_client
    default_client("cuda")
    # What the CUDA client's start does on a GPU (prewarm.start: not under the interpreter).
    from runtime.cuda import prewarm
    freeze = getattr(prewarm, "freeze_gc", None)           # main before i13-warm: none
    row["gc_frozen"] = bool(freeze and freeze())
    gc_log = _gc_watch()
    c0 = time.thread_time()        # CPU seconds of this thread: less moved by other load
    t0 = clock()
    lowered = runtime.jit(fn, backend="cuda", target="h200").lower(*args)
    t1 = clock()
    c1 = time.thread_time()
    compiled = lowered.compile()
    t2 = clock()
    row["lower_cpu"], row["compile_cpu"] = c1 - c0, time.thread_time() - c1
    exe = executable_of(compiled)
    # As the GPU rows count them: ``passes`` the pipeline's own seconds (its pass records),
    # ``other`` the rest of the compile outside codegen (the input's verification and copy,
    # the module cache's key and store, verification after passes, buffer assignment).
    records = compiled.executable.pass_records
    hit = compiled.executable.module_cache_hit
    passes_s = (t2 - t1) - exe.build_seconds if hit or not records else \
        sum(r.seconds for r in records)
    per_pass: dict = {}
    for r in records:
        per_pass[r.name.split("{")[0]] = per_pass.get(r.name.split("{")[0], 0.0) + r.seconds
    row["per_pass"] = {k: round(v, 4) for k, v in sorted(per_pass.items(), key=lambda kv: -kv[1])}
    row["instructions"] = sum(len(c.instructions) for c in lowered.module.computations)
    os.environ.pop("TRITON_INTERPRET", None)
    from codegen.triton import kernel as kernel_mod
    kernel_mod._MODULES.clear()
    kernels = exe._triton_kernels()
    for k in kernels:
        k._fn = None
    t3 = clock()
    for k in kernels:
        k.fn                                   # noqa: B018  (the module import, the JIT)
    t4 = clock()
    gc_log["stop"]()
    row["gc_objects"], row["gc_full"] = gc_log["objects"], gc_log["full"]
    row.update(lower=t1 - t0, passes=passes_s, codegen=exe.build_seconds,
               other=max(0.0, (t2 - t1) - passes_s - exe.build_seconds),
               kernels=t4 - t3, first_call=t4 - t3 + t2 - t0, gc=gc_log["s"], gc_n=gc_log["n"],
               cache_hit=hit, n_kernels=len(kernels))
    return row


def _extra_env(opts) -> dict:
    """``--env K=V,K=V``: set in every child (a variant of the library's settings)."""
    out = {}
    for item in filter(None, (opts.env or "").split(",")):
        k, _, v = item.partition("=")
        out[k.strip()] = v.strip()
    return out


# This module's name as ``-m`` ran it (a copy under another name runs its own children).
_MODULE = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", "") \
    if __name__ == "__main__" else __name__
_MODULE = _MODULE if _MODULE.startswith("benchmarks.") else "benchmarks.compile_time"


def run_child(name: str, cache: str, opts, machine: str = "", cprofile: bool = False) -> dict:
    first = not os.path.exists(os.path.join(cache, "hlotk"))
    env = dict(os.environ, **_extra_env(opts))
    env.update(HLOTK_CACHE_DIR=os.path.join(cache, "hlotk"),
               HLOTK_CT_PROFILE="1" if first and opts.profile else "0",
               HLOTK_CT_CPROFILE="1" if cprofile else "0",
               TRITON_CACHE_DIR=os.path.join(cache, "triton"), PYTHONUNBUFFERED="1")
    if machine:
        env["HLOTK_MACHINE_CACHE_DIR"] = machine
    if opts.interpret:
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", _MODULE, "--child", name,
           "--autotune", opts.autotune] + (["--deviceless"] if opts.deviceless else []) \
        + (["--interpret"] if opts.interpret else []) \
        + (["--worker-probe", opts.worker_probe] if opts.worker_probe else [])
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=opts.child_timeout)
    except subprocess.TimeoutExpired:
        return {"name": name, "failed": f"over {opts.child_timeout} s"}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"name": name, "failed": (p.stderr or p.stdout)[-800:]}


def _cold_min(name: str, cache: str, opts, machine: str) -> dict:
    """``--repeat N``: N cold processes (each with empty caches; the last one fills
    ``cache`` for the warm run); each phase's minimum over them (on a shared machine the
    minimum is the least disturbed measurement), every run's row under ``repeats``."""
    rows = []
    for k in range(opts.repeat):
        with tempfile.TemporaryDirectory(prefix="hlotk_ct_rep_") as other:
            rows.append(run_child(name, cache if k == opts.repeat - 1 else other, opts,
                                  machine))
    good = [r for r in rows if "failed" not in r]
    if not good:
        return rows[-1]
    out = dict(good[-1])
    for key, value in good[-1].items():
        if isinstance(value, float) and all(isinstance(r.get(key), float) for r in good):
            out[key] = min(r[key] for r in good)
    out["repeats"] = [{k: v for k, v in r.items() if isinstance(v, float)} for r in rows]
    return out


def fmt(row: dict, key: str) -> str:
    v = row.get(key)
    return "-" if v is None else f"{v:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--autotune", default="1")
    ap.add_argument("--deviceless", action="store_true")
    ap.add_argument("--interpret", action="store_true", help="no GPU: the CUDA backend's "
                    "lower/compile under Triton's interpreter and the kernels' JIT objects "
                    "(the warm first call's CPU work; implies --deviceless)")
    ap.add_argument("--child", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--records", default="", help="append the cold runs' measured kernels "
                    "(calibration records) to this file")
    ap.add_argument("--child-timeout", type=float, default=90.0)
    ap.add_argument("--profile", action="store_true", help="after the cold run's phases, "
                    "time every kernel alone (exe.profile): more calibration records")
    ap.add_argument("--machine-cache", default="", help="the machine cache (native launcher, "
                    "Triton's key) to use; default: a fresh one for this run, filled first "
                    "and timed as 'once per machine'")
    ap.add_argument("--machine-cold", action="store_true", help="a fresh machine cache for "
                    "every cold run (each pays the native build and Triton's hash)")
    ap.add_argument("--cprofile", action="store_true", help="a third run per program: warm, "
                    "under cProfile (its top functions go to the JSON, not the table)")
    ap.add_argument("--cprofile-only", default="", help="NAMES: --cprofile for these only")
    ap.add_argument("--env", default="", help="K=V,K=V set in every child: a variant of the "
                    "library's settings (e.g. HLOTK_COMPILE_EARLY=0)")
    ap.add_argument("--tag", default="", help="a label for this run's rows (variants)")
    ap.add_argument("--repeat", type=int, default=1, help="cold runs per program (fresh "
                    "caches each); the table shows each phase's minimum over them")
    ap.add_argument("--runs", default="cold,warm", help="which runs per program: cold, "
                    "warm or both (cold alone: before/after rounds in less device time)")
    ap.add_argument("--heldout", action="store_true", help="the held-out programs "
                    "(benchmarks/heldout_programs.py): alone, or beside --only's")
    ap.add_argument("--worker-probe", default="", help="COUNTS[:key], e.g. 1,4,16:key: "
                    "start that many compile workers side by side, each compiling a small "
                    "kernel twice (start-up and compile under contention); no programs")
    opts = ap.parse_args()
    opts.deviceless = opts.deviceless or opts.interpret
    if opts.worker_probe and not opts.child:
        counts, _, warm = opts.worker_probe.partition(":")
        for n in counts.split(","):
            row = run_child(f"probe{n}", tempfile.mkdtemp(prefix="hlotk_ct_probe_"), opts,
                            opts.machine_cache)
            print(("" if "failed" in row else
                   f"| probe x{n} ({warm or 'no key'}) | " + " | ".join(
                       f"{k} {row.get(k, 0):.2f}/{row.get(k + '_max', 0):.2f}"
                       for k in ("spawn", "import", "key", "warm_compile", "warm_compile2",
                                 "ready_after")) + " |") or f"probe x{n}: {row}", flush=True)
            print("RESULT-PROBE " + json.dumps(row), flush=True)
        return
    if opts.child:
        if opts.child.startswith("probe"):
            counts, _, warm = opts.worker_probe.partition(":")
            row = child_worker_probe(int(opts.child[5:]), warm)
        elif opts.child == "machine":
            row = child_machine()
        else:
            row = child_interpret(opts.child) if opts.interpret else \
                child_deviceless(opts.child) if opts.deviceless else \
                child_gpu(opts.child, opts.autotune)
        print("RESULT " + json.dumps(row))
        return
    from benchmarks.gpu_suite import programs
    only = set(filter(None, opts.only.split(",")))
    first = ("transformer", "mlp_train", "adam_step")     # the table first
    from benchmarks.attention import suite_programs
    from benchmarks.heldout_programs import NAMES as HELDOUT
    # issue 14's and the held-out programs (benchmarks/heldout_programs.py), by name only
    extra = [p[0] for p in suite_programs() if p[0] in only] + \
        [n for n in HELDOUT if n in only or opts.heldout]
    suite = [] if opts.heldout and not only else \
        [p[0] for p in programs() if not only or p[0] in only]
    names = sorted(suite + extra,
                   key=lambda n: (n not in first, first.index(n) if n in first else 0))
    phases = ("lower", "passes", "other", "codegen", "kernels", "gc") if opts.interpret else \
        ("lower", "passes", "codegen") if opts.deviceless else PHASES
    head = "| program | run | " + " | ".join(phases) + " | first call | XLA lower+compile | ratio |"
    lines = [head, "|" + "---|" * (len(phases) + 5)]
    rows = []
    machine = opts.machine_cache or tempfile.mkdtemp(prefix="hlotk_ct_machine_")
    header = ""
    if not opts.deviceless and not opts.machine_cold:
        row = run_child("machine", machine, opts, machine)
        row["run"] = "machine"
        rows.append(row)
        header = (f"Once per machine (before the programs, `HLOTK_MACHINE_CACHE_DIR`): Triton's "
                  f"key {row.get('triton_key', float('nan')):.2f} s, native launcher build "
                  f"{row.get('native_build', float('nan')):.2f} s"
                  + (f" ({row['native_error']})" if "native_error" in row else "")
                  + (f" (failed: {row['failed'][-300:]})" if "failed" in row else "")
                  + ". Cold runs below use that machine cache (empty program caches).")
        print(header, flush=True)
    for name in names:
        with tempfile.TemporaryDirectory(prefix="hlotk_ct_") as cache:
            prof = opts.cprofile or name in set(filter(None, opts.cprofile_only.split(",")))
            wanted = set(filter(None, opts.runs.split(",")))
            runs = tuple(r for r in ("cold", "warm") if r in wanted) \
                + (("warm-cprofile",) if prof else ())
            mdir = tempfile.mkdtemp(prefix="hlotk_ct_machine_") if opts.machine_cold else machine
            for run in runs:
                if run == "cold" and opts.repeat > 1:
                    row = _cold_min(name, cache, opts, "" if opts.deviceless else mdir)
                else:
                    row = run_child(name, cache, opts, "" if opts.deviceless else mdir,
                                    cprofile=run == "warm-cprofile")
                row["run"] = run
                if run == "warm-cprofile":
                    rows.append(row)
                    continue
                rows.append(row)
                if "failed" in row:
                    print(f"{name} {run}: FAILED {row['failed']}", file=sys.stderr)
                    lines.append(f"| {name} | {run} | failed |")
                    continue
                xla = row.get("xla")
                ratio = f"{row['first_call'] / xla:.2f}" if xla else "-"
                lines.append(f"| {name}{opts.tag} | {run} | "
                             + " | ".join(fmt(row, k) for k in phases)
                             + f" | {row['first_call']:.2f} | {fmt(row, 'xla')} | {ratio} |")
                print(lines[-1], flush=True)
                if not opts.deviceless:
                    print(f"POOL {name}{opts.tag} {run}: " + " ".join(
                        f"{k}={row.get(k, 0):.2f}" if isinstance(row.get(k, 0), float)
                        else f"{k}={row.get(k)}" for k in POOL_COLS)
                        + f" via={row.get('via')}"
                        + (f" notes={row['compile_notes']}" if row.get("compile_notes") else "")
                        + (f" errors={row['job_errors']}" if row.get("job_errors") else ""),
                        flush=True)
                    pw = row.get("prewarm", {})
                    print(f"LIB {name}{opts.tag} {run}: first-call library thunks "
                          f"{row.get('lib_s', 0):.3f} s in {row.get('lib_n', 0)} (longest "
                          f"{row.get('lib_max', 0):.3f}); warmed while compiling "
                          f"{row.get('library_warm')}; cudnn start-up thread "
                          f"{pw.get('cudnn_s', 0):.3f} s, waited {pw.get('cudnn_wait_s', 0):.3f}"
                          f"; tuned kernels {row.get('tuned_kernels')}; precompile "
                          f"{row.get('precompile')}; max_rel_err {row.get('max_rel_err')}",
                          flush=True)
            records = os.path.join(cache, "hlotk", "calibration", "records.jsonl")
            if opts.records and os.path.exists(records):
                with open(records) as src, open(opts.records, "a") as dst:
                    dst.write(src.read())
        if opts.out:
            write(opts, phases, lines, rows, header)
    print("\n".join(lines))


def write(opts, phases, lines, rows, header: str = "") -> None:
    with open(opts.out, "w") as f:
        f.write(f"# Compile time (issue 13), seconds; autotune level {opts.autotune}"
                f"{' (deviceless: passes and codegen only)' if opts.deviceless else ''}\n\n"
                + (header + "\n\n" if header else "") + "\n".join(lines) + "\n")
    with open(opts.out.replace(".md", ".json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

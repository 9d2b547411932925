"""A Triton compile worker (``codegen/triton/parallel.py`` starts these): run as a plain
script (``python .../compile_worker.py``), it imports the standard library and Triton and
nothing of hlotk (no numpy, torch or jax), so a worker is ready in the time Triton takes to
import.

Protocol, one line each way: at start the worker pays Triton's once-per-process costs (the
compiler's modules, the installation key, and where the parent asks for it
(``HLOTK_WORKER_WARM=compile``, a worker started before its jobs are known) one small
compile into a throwaway cache), then writes ``ready {json}`` (what its start-up took).
Then it reads one JSON job ``[path, name, specialization]`` per stdin line and answers
``ok {json}`` (where the job's seconds went: waiting in the pipe, loading the kernel's
module, Triton's stages, the launcher) or ``error ...``. It exits at the end of stdin.
It compiles without a GPU context (``preload_for_target``) and then builds the kernel's
launcher where this Triton compiles one in C per signature (3.6 does; 3.9 launches from
Python) and the launching process will not launch the kernel itself (``direct_launch.py``:
the default for Triton 3.6, ``launch_params.direct_reason``); ``HLOTK_WORKER_LAUNCHER=0``
leaves that to the launch.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from typing import Any

T_START = time.time()          # this module's first line: spawn + interpreter start before it


def load_fn(path: str, name: str) -> Any:
    """The ``@triton.jit`` function ``name`` of the generated kernel file ``path``, or of
    the module ``path[7:]`` imported by name where ``path`` is ``module:NAME`` (hlotk's own
    hand-written kernels, e.g. flash attention: they import other hlotk modules)."""
    if path.startswith("module:"):
        return getattr(importlib.import_module(path[7:]), name)
    mod_name = f"hlotk_triton_{os.path.basename(path)[:-3]}"
    mod = sys.modules.get(mod_name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(mod_name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod
        spec.loader.exec_module(mod)
    return getattr(mod, name)


class TargetOnlyDriver:
    """A Triton driver that knows only the target it is told (no CUDA): made active in a
    worker, Triton's own ``JITFunction.preload`` compiles a specialization for that target
    without a CUDA context. (Triton's real driver would initialize CUDA in every worker:
    3-5 s each on the H200 host with 15 of them at once, measured in i13-cold's first run,
    where every job went that way.)"""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def is_active(self) -> bool:
        return True


def job_target(data: str, target: str = "") -> Any:
    """The GPUTarget to compile ``data`` for: the one it names (newer Tritons put it in
    the specialization data), else ``target`` (JSON of the launching process's target:
    Triton 3.6's data has none; i13-cold's second device run failed on that)."""
    from triton.backends.compiler import GPUTarget
    named = json.loads(data).get("target") or (json.loads(target) if target else None)
    if not named:
        raise ValueError("the specialization names no target and the parent gave none")
    return GPUTarget(**named)


def preload_for_target(fn: Any, data: str, target: str = "") -> Any:
    """``fn.preload(data)`` (Triton decodes its own specialization data, so every field
    means what the launch meant) with a driver that answers only the job's target."""
    from triton.runtime.driver import driver
    target = job_target(data, target)
    active = getattr(driver, "_active", None)
    if not (isinstance(active, TargetOnlyDriver) and active.target == target):
        driver.set_active(TargetOnlyDriver(target))
    return fn.preload(data)


def _decode_constant(value: Any) -> Any:
    """A constant of Triton's specialization data, as its ``preload`` decodes it."""
    import triton.language as tl
    if isinstance(value, str) and tl.dtype.is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict):
        if "constexpr" in value:
            return tl.constexpr(_tuples(value["constexpr"]))
        raise ValueError(f"a constant this worker cannot rebuild: {sorted(value)}")
    return _tuples(value)


def _tuples(v: Any) -> Any:
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def compile_specialization(fn: Any, data: str, target: str = "") -> Any:
    """Compile what ``data`` (Triton's ``specialization_data``) describes, for the job's
    target (``job_target``), by calling ``triton.compile`` directly (no driver at all): the
    fallback where ``preload_for_target`` fails on some Triton version."""
    import triton
    from triton.compiler import ASTSource, make_backend
    obj = json.loads(data)
    target = job_target(data, target)
    backend = make_backend(target)
    constexprs = {tuple(k): _decode_constant(v)
                  for k, v in zip(obj["constant_keys"], obj["constant_vals"])}
    attrs = dict(zip(map(tuple, obj["attrs_keys"]), obj["attrs_vals"]))
    signature = {k: _tuples(v) for k, v in obj["signature"].items()}
    options = backend.parse_options({k: tuple(v) if isinstance(v, list) else v
                                     for k, v in obj["options"].items()})
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                          options=options.__dict__)


_LAUNCHER_BROKEN = ""      # why this worker cannot build launchers (after the first failure)


def build_launcher(kernel: Any) -> str:
    """Build (into Triton's cache) the launcher the first launch of ``kernel`` would build,
    where this Triton compiles one in C per signature (3.6 does, with gcc: ~0.2-0.5 s each
    in the launching process otherwise); returns "" or why not. Triton's real driver is
    never made here (its constructor imports torch: seconds per worker); a Triton whose
    launcher needs it fails at once, and this worker stops trying. Best effort: no C
    compiler or no CUDA library here just leaves it to the launch."""
    global _LAUNCHER_BROKEN
    if _LAUNCHER_BROKEN:
        return _LAUNCHER_BROKEN
    if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")):
        _LAUNCHER_BROKEN = "no NVIDIA driver on this machine"
        return _LAUNCHER_BROKEN
    try:
        from triton.backends.nvidia.driver import CudaLauncher
        CudaLauncher(kernel.src, kernel.metadata)
        return ""
    except Exception as e:  # noqa: BLE001  (the launch builds it, as it would anyway)
        _LAUNCHER_BROKEN = f"{type(e).__name__}: {e}"[:200]    # not tried again here
        return _LAUNCHER_BROKEN


class _Stages:
    """Triton's per-stage compile times (its ``knobs.compilation.listener``, where this
    Triton has one), in seconds: ``ir`` (the front end: Python AST to TTIR), then each
    lowering stage by name (ttir, ttgir, llir, ptx, cubin: the last is ptxas)."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}
        try:
            from triton import knobs
            knobs.compilation.listener = self
        except (ImportError, AttributeError):
            pass

    def __call__(self, *, times: Any = None, cache_hit: bool = False, **_: Any) -> None:
        if times is None:
            return
        out = {"ir": times.ir_initialization / 1e6, "hit": float(cache_hit)}
        for name, us in times.lowering_stages:
            out[name] = us / 1e6
        out["store"] = times.store_results / 1e6
        self.last = out


_STAGES: Any = None


def compile_job(path: str, name: str, data: str, target: str = "") -> dict:
    """Compile one specialization into Triton's on-disk cache; returns where the seconds
    went and which way it compiled (``via``): Triton's ``preload`` with a target-only
    driver, else ``triton.compile`` directly, else (where both fail) ``preload`` with
    Triton's real driver (which initializes CUDA in this worker: slow, but the same
    binary)."""
    clock = time.perf_counter
    out: dict[str, Any] = {}
    t0 = clock()
    fn = load_fn(path, name)
    out["load"] = clock() - t0
    t0 = clock()
    if _STAGES is not None:
        _STAGES.last = {}
    kernel = None
    ways = (("preload", preload_for_target), ("direct", compile_specialization))
    if os.environ.get("HLOTK_WORKER_DRIVER") == "real":     # the way before i13-cold
        ways = ()
    for via, compile_it in ways:
        try:
            kernel = compile_it(fn, data, target)
            out["via"] = via
            break
        except Exception as e:  # noqa: BLE001  (the next way; the answer says why)
            out[via + "_error"] = f"{type(e).__name__}: {e}"[:300]
    else:
        from triton.runtime.driver import driver
        driver.reset_active()
        kernel = fn.preload(data)
        out["via"] = "driver"
    out["compile"] = clock() - t0
    if _STAGES is not None and _STAGES.last:
        out["stages"] = _STAGES.last
    if kernel is not None and os.environ.get("HLOTK_WORKER_LAUNCHER", "1") == "1":
        direct = launched_directly(kernel)
        if direct:
            out["launcher"] = 0.0
            out["direct"] = 1.0
        else:
            t0 = clock()
            why = build_launcher(kernel)
            out["launcher"] = clock() - t0
            if why:
                out["launcher_error"] = why
    return out


_PARAMS: Any = None


def _launch_params() -> Any:
    """``launch_params.py`` (standard library only), loaded by path like this file."""
    global _PARAMS
    if _PARAMS is None:
        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location(
            "hlotk_launch_params", os.path.join(here, "launch_params.py"))
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["hlotk_launch_params"] = mod      # dataclasses look their module up
        spec.loader.exec_module(mod)
        _PARAMS = mod
    return _PARAMS


def launched_directly(kernel: Any) -> bool:
    """Whether the launching process will launch ``kernel`` through the CUDA driver itself
    (``direct_launch.py``, the same decision): then Triton's C launcher is not built."""
    try:
        import triton
        lp = _launch_params()
        return lp.direct_reason(kernel.src.signature, kernel.metadata, triton.__version__,
                                os.environ) is None
    except Exception:  # noqa: BLE001  (build it, as before)
        return False


# Where Triton versions define or import triton_key(): each module's name is rebound.
TRITON_KEY_MODULES = ("triton.runtime.cache", "triton.compiler.compiler",
                      "triton.runtime.autotuner", "triton.runtime.jit")


def patch_triton_key(value: str) -> Any:
    """Make every module in TRITON_KEY_MODULES answer ``value`` for triton_key(); returns the
    stand-in function (``codegen/triton/triton_key.py`` uses this too)."""
    import importlib

    def triton_key() -> str:
        return value
    for name in TRITON_KEY_MODULES:
        mod = sys.modules.get(name)
        if mod is None:
            try:
                mod = importlib.import_module(name)
            except ImportError:
                continue
        if hasattr(mod, "triton_key"):
            mod.triton_key = triton_key
    return triton_key


def use_parent_key() -> bool:
    """Use the Triton installation key the parent passed in ``HLOTK_TRITON_KEY`` (it read
    it from its disk cache or hashed it for this same installation: the worker runs the
    parent's interpreter), instead of hashing Triton's sources and library again (~0.3 s)."""
    value = os.environ.get("HLOTK_TRITON_KEY")
    if not value:
        return False
    patch_triton_key(value)
    return True


def warm_target() -> Any:
    """The target of the warm-up compile: ``HLOTK_WORKER_TARGET`` (``backend,arch,warp``,
    set by a parent that knows its GPU), else an H100/H200 (sm_90)."""
    from triton.backends.compiler import GPUTarget
    parts = os.environ.get("HLOTK_WORKER_TARGET", "cuda,90,32").split(",")
    try:
        return GPUTarget(parts[0], int(parts[1]), int(parts[2]))
    except (IndexError, ValueError):
        return GPUTarget("cuda", 90, 32)


def warm_compile(block: int = 1024) -> None:
    """One small kernel compiled for ``warm_target()`` into a throwaway cache directory
    (removed after), so that this process's first real job does not pay Triton's lazy
    start-up."""
    import shutil
    import tempfile

    from triton import knobs
    from triton.compiler import ASTSource
    here = os.path.dirname(os.path.abspath(__file__))
    fn = load_fn(os.path.join(here, "warmup_kernel.py"), "hlotk_warmup")
    tmp = tempfile.mkdtemp(prefix="hlotk-warm-")
    old = knobs.cache.dir
    try:
        knobs.cache.dir = tmp
        import triton
        src = ASTSource(fn, {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32",
                             "BLOCK": "constexpr"}, {(3,): block})
        triton.compile(src, target=warm_target())
    finally:
        knobs.cache.dir = old
        shutil.rmtree(tmp, ignore_errors=True)


def warm_up() -> dict:
    """Triton's once-per-process costs, paid before the first job; their seconds."""
    clock = time.perf_counter
    info: dict[str, Any] = {}
    t0 = clock()
    try:
        import triton.compiler  # noqa: F401
        info["import"] = clock() - t0
        t0 = clock()
        if not use_parent_key():
            from triton.runtime.cache import triton_key
            triton_key()
        info["key"] = clock() - t0
        global _STAGES
        _STAGES = _Stages()
        warm = os.environ.get("HLOTK_WORKER_WARM", "import")
        if warm in ("compile", "compile2"):
            t0 = clock()
            warm_compile()
            info["warm_compile"] = clock() - t0
        if warm == "compile2":      # benchmarks: a second compile, after the start-up
            t0 = clock()
            warm_compile(512)
            info["warm_compile2"] = clock() - t0
    except Exception as e:  # noqa: BLE001  (the first job pays them instead)
        info["warm_error"] = f"{type(e).__name__}: {e}"[:200]
    return info


def main() -> None:
    t_main = time.time()
    try:
        # Below the process that waits for it: a worker never takes a core from the
        # program it compiles for (HLOTK_WORKER_NICE, default 5; 0 leaves it as is).
        os.nice(int(os.environ.get("HLOTK_WORKER_NICE", "5")))
    except (OSError, ValueError, AttributeError):
        pass
    info = warm_up()
    try:
        info["spawn"] = T_START - float(os.environ.get("HLOTK_WORKER_T0", T_START))
    except ValueError:
        pass
    info["to_main"] = t_main - T_START
    info["t_start"] = T_START
    info["ready_at"] = time.time()
    sys.stdout.write("ready " + json.dumps(info) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        t_recv = time.time()
        try:
            out = compile_job(*json.loads(line))
            out["recv_at"], out["done_at"] = t_recv, time.time()
            answer = "ok " + json.dumps(out)
        except Exception as e:  # noqa: BLE001  (reported; the launch compiles it instead)
            answer = f"error {type(e).__name__}: {e}".replace("\n", " ")[:500]
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

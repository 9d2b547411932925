"""Compile many Triton kernel variants at once, in a process pool, before their first launch.

Triton compiles a ``@triton.jit`` function at its first launch with given arguments, one
after another, each 0.3-2 s of Python, MLIR, LLVM and ptxas. ``precompile(jobs)`` asks
Triton what each (kernel, arguments, config) would compile, without compiling it: a
``jit_cache_hook`` that returns True stops the JIT after it has worked out the
specialization (argument types, alignment, constants, options) and hands us that as JSON.
Worker processes (one per CPU, started once per process) load the kernel's source file and
``preload`` that specialization, which compiles it into Triton's on-disk cache; the real
launches then find it there, under exactly the key they look up. Anything that fails here
is left to the launch, which compiles it as before, so this only ever saves time.

Variants compiled once are remembered (``$HLOTK_CACHE_DIR/triton/compiled.txt``, by kernel
hash, config, device and Triton version), so a warm process starts no pool at all.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Optional

from codegen.cache import cache_root

_POOL: Optional[ProcessPoolExecutor] = None
_DONE: Optional[set[str]] = None


def pool_size() -> int:
    return max(1, os.cpu_count() or 1)


def _pool() -> ProcessPoolExecutor:
    global _POOL
    if _POOL is None:
        import multiprocessing
        # spawn: the parent holds a CUDA context and threads, which fork would copy.
        _POOL = ProcessPoolExecutor(pool_size(), mp_context=multiprocessing.get_context("spawn"))
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


def _preload(path: str, name: str, data: str) -> bool:
    """In a worker: compile one specialization into Triton's on-disk cache."""
    mod_name = f"hlotk_triton_{os.path.basename(path)[:-3]}"
    mod = sys.modules.get(mod_name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(mod_name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod
        spec.loader.exec_module(mod)
    getattr(mod, name).preload(data)
    return True


def precompile(jobs: list[tuple[Any, list, dict]]) -> dict[str, int]:
    """Compile each (kernel, launch arguments, config) in the process pool. Returns counts:
    ``compiled`` (in the pool), ``known`` (compiled by an earlier process), ``failed`` (left
    to the launch)."""
    stats = {"compiled": 0, "known": 0, "failed": 0}
    pending: dict[str, tuple[str, str, str]] = {}
    keys: dict[str, str] = {}
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
    futures = {data: _pool().submit(_preload, *job) for data, job in pending.items()}
    ok = []
    for data, fut in futures.items():
        try:
            fut.result()
            ok.append(keys[data])
            stats["compiled"] += 1
        except Exception:  # noqa: BLE001
            stats["failed"] += 1
    _mark(ok)
    return stats

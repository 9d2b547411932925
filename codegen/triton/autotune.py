"""Autotuning of generated Triton kernels: ranked by a cost model, compiled in parallel,
measured once per (kernel source, device, Triton version) and remembered on disk.

``HLOTK_AUTOTUNE`` picks the level: ``0`` (off: each template's default config), ``1``
(pruned: the cost model ranks a template's candidate configs and only the best
``PRUNED_TOP`` plus the default are compiled, in parallel, and timed in one batch of
CUDA-event launches, milliseconds per kernel) or ``2`` (exhaustive: every candidate, each
timed with ``triton.testing.do_bench``).

At level 1 the loop kernels (``UNTIMED_AT_PRUNED``: elementwise and generic loop templates
predicted under ``LOOP_TIMED_FROM_US``, by default all of them) compile only their
template's own config and time nothing: their candidates differ only in block size and
warps, and on the H200 the best of all of them beat the default by 2.4% summed over
adam_step's loop kernels (at most 1.4 µs, 3.5%, on one; level-2 measurements, NOTES "Final
validation ... fifth 2026-11-26 session"), while each candidate is a Triton compile on the
first call's critical path (adam_step cold: 1.28 s timing the large ones, 1.17 s timing
none). Reductions, transposes, GEMM and attention are timed: there the config moved kernels
by 6-17%. ``HLOTK_TUNE_LOOPS_FROM_US`` times loop kernels predicted at or above that many
microseconds (``0``: all of them).
Level 1 times no kernel of any template that the cost model predicts under
``TIMED_FROM_US`` (1.5x its launch term): such a kernel is launch-bound, so any other
config can win it at most about a microsecond, while each candidate is one more Triton
compile on the cold first call's critical path (a ResNet block's batch-norm statistics:
eight column-finish kernels of 2 µs with four candidates each, NOTES "i13-resnet-cold").
``HLOTK_TUNE_FROM_US`` moves the bound (``0``: time every template's small kernels too).
Level 2 times every candidate of every template. A kernel left with a single config to try
is never timed (``needs_timing``).

Results live in ``$HLOTK_CACHE_DIR/triton/tuning.json`` keyed by the kernel's content key (a
hash of its code without HLO names, ``canonical.py``: fusions sharing a kernel share its
result), the device name and the Triton version, so a re-run measures nothing it already
knows. Every timed config is also appended, beside the fusion
cost model's prediction for the kernel, to ``$HLOTK_CACHE_DIR/calibration/records.jsonl``
(what ``hlotk calibrate`` fits device coefficients to).

Candidates compile in parallel, in a process pool (``parallel.precompile``; an executable
compiles all its kernels and their candidates there at once before its first call). Progress is
one tqdm bar per executable's first call (``autotune_progress``), shown only on a terminal
and silenced by ``HLOTK_PROGRESS=0``.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from codegen.cache import cache_root
from codegen.triton.templates import ROW_TILE_ELEMENTS_PER_THREAD

PRUNED_TOP = 3      # configs timed at level 1, besides the template's default
# Templates whose candidates level 1 does not time when the kernel is predicted under
# LOOP_TIMED_FROM_US (the module's docstring says why). ``HLOTK_TUNE_LOOPS_FROM_US``
# overrides the bound ("inf": never time a loop kernel at level 1; "0": always).
UNTIMED_AT_PRUNED = frozenset({"loop", "generic"})
LOOP_TIMED_FROM_US = math.inf
# Level 1 times no kernel predicted under this many µs, whatever its template (the module's
# docstring says why): 1.5x the cost model's 2 µs launch term. ``HLOTK_TUNE_FROM_US``
# overrides it ("0": time small kernels too, as before).
TIMED_FROM_US = 3.0


def _microseconds(name: str, default: float) -> float:
    env = os.environ.get(name, "").strip()
    try:
        return float(env) if env else default
    except ValueError:
        from codegen.triton.elemental import TritonCodegenError
        raise TritonCodegenError(f"{name}={env!r}: expected microseconds "
                                 "(a number, or inf)") from None


def loop_timed_from_us() -> float:
    return _microseconds("HLOTK_TUNE_LOOPS_FROM_US", LOOP_TIMED_FROM_US)


def timed_from_us() -> float:
    """The bound under which level 1 times no kernel (``HLOTK_TUNE_FROM_US``)."""
    return _microseconds("HLOTK_TUNE_FROM_US", TIMED_FROM_US)

# Seconds spent in this process (benchmarks/compile_time.py reports them): ``tune`` is the
# whole of autotuning, ``tune_compile`` the part of it compiling candidates.
SECONDS = {"tune": 0.0, "tune_compile": 0.0, "tuned_kernels": 0}

LEVELS = {"": 0, "0": 0, "off": 0, "false": 0, "no": 0,
          "1": 1, "on": 1, "true": 1, "yes": 1, "pruned": 1,
          "2": 2, "all": 2, "exhaustive": 2}


def autotune_level(value: Optional[Any] = None) -> int:
    """0/1/2 from ``value`` (a bool, an int or a string) or ``$HLOTK_AUTOTUNE``."""
    if value is None:
        value = os.environ.get("HLOTK_AUTOTUNE", "0")
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return max(0, min(2, value))
    level = LEVELS.get(str(value).strip().lower())
    if level is None:
        from codegen.triton.elemental import TritonCodegenError
        raise TritonCodegenError(f"HLOTK_AUTOTUNE={value!r}: expected 0 (off), 1 (pruned) "
                                 "or 2 (exhaustive)")
    return level


# --- the config cost model ---------------------------------------------------------------------
def predict_config_us(kernel_us: float, grid: tuple, config: dict, spec: Any) -> float:
    """The fusion's predicted time (``kernel_us``, launch included) adjusted for one launch
    config: programs run in waves over the SMs (``sm_count`` x resident programs, bounded
    by 64 warps per SM), so a grid that leaves SMs idle in its last wave, or that has fewer
    programs than SMs, pays for the idle part."""
    launch = spec.kernel_launch_us
    programs = max(1, math.prod(grid))
    warps = max(1, int(config.get("num_warps", 4)))
    per_sm = max(1, 64 // warps)
    if "BLOCK_K" in config:      # a GEMM tile's shared memory bounds residency
        elem = 2
        smem = config.get("num_stages", 1) * (config["BLOCK_M"] + config["BLOCK_N"]) \
            * config["BLOCK_K"] * elem
        per_sm = max(1, min(per_sm, int(spec.shared_memory_per_sm_bytes // max(smem, 1))))
    slots = spec.sm_count * per_sm
    waves = math.ceil(programs / slots)
    if programs < spec.sm_count:
        efficiency = programs / spec.sm_count     # only that share of the SMs works
    else:                                         # a wave half full of resident programs
        efficiency = min(1.0, 2.0 * programs / (waves * slots))   # saturates the SMs
    return launch + max(kernel_us - launch, 0.0) / efficiency


def elements_per_thread(config: dict) -> Optional[float]:
    """Elements of a row tile ([BLOCK_M, BLOCK_N], no BLOCK_K) per thread of ``config``;
    None for other tiles (GEMM, transpose, loop)."""
    if "BLOCK_M" not in config or "BLOCK_N" not in config or "BLOCK_K" in config:
        return None
    return config["BLOCK_M"] * config["BLOCK_N"] / (32 * int(config.get("num_warps", 4)))


def ranked_candidates(kernel: Any, level: int, spec: Any) -> list[dict]:
    """The configs to time: all of them at level 2, else the default and the best
    ``PRUNED_TOP`` others by ``predict_config_us``; only the default at level 1 for a
    kernel predicted (non-zero) under ``timed_from_us`` and for a small loop kernel
    (``UNTIMED_AT_PRUNED``, ``loop_timed_from_us``)."""
    cands = list(kernel.plan.candidates or [kernel.config])
    if kernel.config not in cands:
        cands.insert(0, dict(kernel.config))
    predicted = getattr(kernel, "predicted_us", 0.0) or 0.0     # 0: no prediction
    if level < 2 and (0.0 < predicted < timed_from_us() or (
            getattr(kernel, "template", "") in UNTIMED_AT_PRUNED and
            predicted < loop_timed_from_us())):
        return [dict(kernel.config)]
    if level >= 2:
        return cands
    # Level 1: no candidate heavier per thread than the default (its Triton compile is the
    # slowest of the pool's jobs, and none of them measured faster: templates.py,
    # ROW_TILE_ELEMENTS_PER_THREAD).
    bound = max(elements_per_thread(kernel.config) or 0, ROW_TILE_ELEMENTS_PER_THREAD)
    cands = [c for c in cands if c == kernel.config or (elements_per_thread(c) or 0) <= bound]
    if len(cands) <= PRUNED_TOP + 1:
        return cands
    base = getattr(kernel, "predicted_us", 0.0) or 10.0

    def cost(c: dict) -> float:
        return predict_config_us(base, kernel.plan.grid(dict(c)), c, spec)
    others = sorted((c for c in cands if c != kernel.config), key=cost)
    return [dict(kernel.config)] + others[:PRUNED_TOP]


def needs_timing(kernel: Any, level: int, spec: Any) -> bool:
    """Whether autotuning at ``level`` has more than one config of ``kernel`` to compare
    (with one, its first launch just uses it: no candidate compile, no timing)."""
    return level > 0 and len(ranked_candidates(kernel, level, spec)) > 1


# --- the on-disk results ----------------------------------------------------------------------
def tuning_path() -> Path:
    return cache_root() / "triton" / "tuning.json"


def records_path() -> Path:
    return cache_root() / "calibration" / "records.jsonl"


def device_name() -> str:
    try:
        import torch
        return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        return "unknown"


def triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return "none"


def tuning_key(kernel_key: str, device: Optional[str] = None,
               version: Optional[str] = None) -> str:
    return f"{kernel_key}|{device or device_name()}|triton {version or triton_version()}"


_TABLE: dict[str, Any] = {}      # path -> (mtime, table): read once per process


def load_table() -> dict:
    path = tuning_path()
    try:
        st = path.stat()
        mtime = (st.st_mtime_ns, st.st_size)
    except OSError:
        return {}
    hit = _TABLE.get(str(path))
    if hit is not None and hit[0] == mtime:
        return hit[1]
    try:
        table = json.loads(path.read_text())
        if not isinstance(table, dict):
            raise ValueError(f"a JSON {type(table).__name__}, not an object")
    except (OSError, ValueError) as e:
        import warnings
        from codegen.cache import CacheWarning
        warnings.warn(f"hlotk: the autotuning table {path} is unreadable ({e}); its kernels "
                      "are measured again", CacheWarning, stacklevel=2)
        table = {}
    _TABLE[str(path)] = (mtime, table)
    return table


def tuned_config(kernel_key: str) -> Optional[dict]:
    entry = load_table().get(tuning_key(kernel_key))
    return dict(entry["config"]) if isinstance(entry, dict) and "config" in entry else None


def _write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def store(kernel: Any, best: dict, timed: list[tuple[dict, float]]) -> None:
    """Remember the best config (and what was measured) for this kernel, device and Triton
    version; append each measurement to the calibration records."""
    table = dict(load_table())
    table[tuning_key(kernel.key)] = {"config": best, "kernel": kernel.name,
                                     "measured_us": {json.dumps(c, sort_keys=True): us
                                                     for c, us in timed}}
    try:
        _write_json_atomic(tuning_path(), table)
    except OSError:
        pass
    for c, us in timed:
        record_measurement(kernel, us, config=c, source="autotune")


def record_measurement(kernel: Any, measured_us: float, *, config: Optional[dict] = None,
                       source: str = "profile") -> None:
    """Append one measured kernel time beside the cost model's prediction for it."""
    rec = {"kernel": kernel.name, "key": kernel.key, "fusion": kernel.fusion_name,
           "template": kernel.template, "device": device_name(), "triton": triton_version(),
           "config": config or kernel.config, "measured_us": measured_us,
           "predicted_us": getattr(kernel, "predicted_us", None),
           "bytes": getattr(kernel, "predicted_bytes", None),
           "flops": getattr(kernel, "predicted_flops", None),
           "fusion_kind": getattr(kernel, "fusion_kind", ""), "source": source,
           "time": time.time()}
    try:
        path = records_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
    except OSError:
        pass


# --- progress ---------------------------------------------------------------------------------
_BAR: list[Any] = []


def progress_enabled() -> bool:
    if os.environ.get("HLOTK_PROGRESS", "1").strip().lower() in ("0", "off", "false", "no"):
        return False
    return sys.stderr.isatty()


@contextlib.contextmanager
def autotune_progress(total: int, name: str) -> Iterator[None]:
    """One progress bar over the ``total`` kernels an executable's first call tunes."""
    if total <= 0 or not progress_enabled():
        yield
        return
    from tqdm import tqdm
    bar = tqdm(total=total, desc=f"hlotk autotune {name}", unit="kernel", leave=False,
               file=sys.stderr)
    _BAR.append(bar)
    try:
        yield
    finally:
        _BAR.remove(bar)
        bar.close()


def _advance(kernel_name: str) -> None:
    if _BAR:
        _BAR[-1].set_postfix_str(kernel_name, refresh=False)
        _BAR[-1].update(1)


# --- tuning one kernel ------------------------------------------------------------------------
BATCH_REPS = 10      # launches per config and round at level 1
BATCH_ROUNDS = 2     # rounds over the configs, interleaved; each config keeps its best


def _bench_each(kernel: Any, outputs: list, inputs: list, configs: list[dict]) -> list:
    """Level 2: ``triton.testing.do_bench`` per config (L2 flushed between runs, 20 ms of
    repetitions each): careful, ~0.15 s per config."""
    import triton.testing
    timed: list[tuple[dict, float]] = []
    for c in configs:
        try:
            ms = triton.testing.do_bench(lambda: kernel.launch(outputs, inputs, config=c),
                                         warmup=5, rep=20, return_mode="median")
        except Exception:  # noqa: BLE001  (a config may not fit the device: skip it)
            continue
        timed.append((dict(c), ms * 1e3))
    return timed


def _bench_batch(kernel: Any, outputs: list, inputs: list, configs: list[dict]) -> list:
    """Level 1: every config launched once (loading what the pool compiled), then all of
    them timed in one queue: ``BATCH_ROUNDS`` interleaved rounds of ``BATCH_REPS`` launches
    between CUDA events, one synchronization at the end. Milliseconds per kernel instead of
    do_bench's ~0.15 s per config; enough to rank configs that differ by more than a few
    per cent, which is what the pruned set is for."""
    import torch
    usable = []
    for c in configs:
        try:
            kernel.launch(outputs, inputs, config=c)
        except Exception:  # noqa: BLE001  (a config may not fit the device: skip it)
            continue
        usable.append(c)
    marks: list[tuple[int, Any, Any]] = []
    for _ in range(BATCH_ROUNDS):
        for k, c in enumerate(usable):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(BATCH_REPS):
                kernel.launch(outputs, inputs, config=c)
            end.record()
            marks.append((k, start, end))
    torch.cuda.synchronize()
    best = [float("inf")] * len(usable)
    for k, start, end in marks:
        best[k] = min(best[k], start.elapsed_time(end) * 1e3 / BATCH_REPS)
    return [(dict(c), us) for c, us in zip(usable, best)]


def tune(kernel: Any, outputs: list, inputs: list, args: list, level: int) -> dict:
    """Time the ranked configs of ``kernel`` on these tensors; store and return the best."""
    from passes.fusion.cost_model import get_device
    from .parallel import precompile
    known = tuned_config(kernel.key)
    if known is not None:     # another fusion with this kernel (canonical.py) was timed first
        return known
    t0 = time.perf_counter()
    configs = ranked_candidates(kernel, level, get_device(kernel.target))
    precompile([(kernel, args, c) for c in configs])
    SECONDS["tune_compile"] += time.perf_counter() - t0
    if level >= 2:
        timed = _bench_each(kernel, outputs, inputs, configs)
    else:
        timed = _bench_batch(kernel, outputs, inputs, configs)
    best = dict(min(timed, key=lambda t: t[1])[0]) if timed else dict(kernel.config)
    store(kernel, best, timed)
    _advance(kernel.name)
    SECONDS["tune"] += time.perf_counter() - t0
    SECONDS["tuned_kernels"] += 1
    return best

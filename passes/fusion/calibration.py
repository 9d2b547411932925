"""Calibrating the fusion cost model on measured kernels.

Every kernel the CUDA runtime measures (autotuning, ``exe.profile``) is recorded beside the
cost model's prediction for it (``codegen/triton/autotune.py``: JSON lines with
``predicted_us``, ``measured_us``, ``bytes``, ``flops``, ``fusion_kind``, ``key``...).
``fit`` finds the device coefficients that make the model agree with those measurements:

    time = kernel_launch_us + max(bytes / (HBM bandwidth x memory_efficiency),
                                  compute time x compute_scale)

minimizing the squared log error over kernels (a kernel 2x too slow and one 2x too fast
count the same), with ``scipy.optimize.least_squares``. ``compute_scale`` divides every
compute rate of the spec (tensor and CUDA cores, SFUs). A kernel is one point: the best
measured time over the configs tried (what the tuned kernel runs at). How far each fusion
kind stays off after the fit is reported (``kind_residuals``), not folded into the spec.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from .cost_model import DeviceSpec


@dataclass(frozen=True)
class KernelPoint:
    key: str
    kind: str
    measured_us: float
    memory_us: float      # bytes / the base spec's effective bandwidth
    compute_us: float     # the base spec's compute time (0 where the record cannot tell)


def load_records(paths: Iterable[str | Path]) -> list[dict]:
    out = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def kernel_points(records: Sequence[dict], base: DeviceSpec,
                  device: Optional[str] = None) -> list[KernelPoint]:
    """One point per kernel (by source key): its fastest measurement. The compute time is
    recovered from the base prediction where the kernel was predicted compute-bound
    (prediction - launch > memory time); elsewhere it is below the memory time and plays
    no part in the max (set to 0)."""
    best: dict[str, dict] = {}
    for r in records:
        if device and r.get("device") != device:
            continue
        if not r.get("measured_us") or not r.get("predicted_us") or r.get("bytes") is None:
            continue
        cur = best.get(r["key"])
        if cur is None or r["measured_us"] < cur["measured_us"]:
            best[r["key"]] = r
    points = []
    for key, r in sorted(best.items()):
        memory_us = r["bytes"] / base.bytes_per_us
        body = r["predicted_us"] - base.kernel_launch_us
        compute_us = body if body > memory_us * (1 + 1e-9) else 0.0
        points.append(KernelPoint(key, r.get("fusion_kind") or r.get("template", ""),
                                  float(r["measured_us"]), memory_us, compute_us))
    return points


def predict(p: KernelPoint, launch_us: float, memory_scale: float, compute_scale: float) -> float:
    return launch_us + max(p.memory_us * memory_scale, p.compute_us * compute_scale)


def errors(points: Sequence[KernelPoint], launch_us: float, memory_scale: float = 1.0,
           compute_scale: float = 1.0) -> list[float]:
    """|log(predicted / measured)| per point."""
    return [abs(math.log(predict(p, launch_us, memory_scale, compute_scale) / p.measured_us))
            for p in points]


def summary(errs: Sequence[float]) -> dict:
    return {"kernels": len(errs), "median": statistics.median(errs) if errs else float("nan"),
            "worst": max(errs) if errs else float("nan")}


@dataclass(frozen=True)
class Fit:
    spec: DeviceSpec               # the calibrated device
    launch_us: float
    memory_scale: float            # base memory time x this = calibrated memory time
    compute_scale: float
    before: dict                   # summary() of the base model on the points
    after: dict
    kind_residuals: dict           # kind -> median log(measured / predicted) after the fit


def fit(points: Sequence[KernelPoint], base: DeviceSpec, key: str = "") -> Fit:
    """Fit launch cost, memory efficiency and compute scale to ``points`` (needs >= 3)."""
    import numpy as np
    from scipy.optimize import least_squares
    if len(points) < 3:
        from hlo.errors import HlotkError
        raise HlotkError(f"calibration needs at least 3 measured kernels, got {len(points)}")
    measured = np.array([p.measured_us for p in points])
    mem = np.array([p.memory_us for p in points])
    comp = np.array([p.compute_us for p in points])

    def residuals(theta):
        launch, ms, cs = np.exp(theta)
        return np.log((launch + np.maximum(mem * ms, comp * cs)) / measured)
    theta0 = np.log([base.kernel_launch_us, 1.0, 1.0])
    # Bounds keep the coefficients physical: a launch of 0.5-50 us, a bandwidth of 5-200 %
    # of the base effective one, compute rates within 10x.
    lo = np.log([0.5, 0.5, 0.1])
    hi = np.log([50.0, 20.0, 10.0])
    sol = least_squares(residuals, np.clip(theta0, lo, hi), bounds=(lo, hi), loss="soft_l1")
    launch, ms, cs = (float(v) for v in np.exp(sol.x))
    spec = calibrated_spec(base, launch, ms, cs, key or f"{base.key}-calibrated")
    after = errors(points, launch, ms, cs)
    kinds: dict[str, list[float]] = {}
    for p in points:
        kinds.setdefault(p.kind, []).append(math.log(p.measured_us / predict(p, launch, ms, cs)))
    return Fit(spec, launch, ms, cs, summary(errors(points, base.kernel_launch_us)),
               summary(after), {k: statistics.median(v) for k, v in sorted(kinds.items())})


def calibrated_spec(base: DeviceSpec, launch_us: float, memory_scale: float,
                    compute_scale: float, key: str) -> DeviceSpec:
    """``base`` with the fitted coefficients: memory time x ``memory_scale`` is a lower
    memory efficiency (it may exceed 1: the model counts bytes a cache serves), compute
    time x ``compute_scale`` is every compute rate divided by it."""
    return dataclasses.replace(
        base, key=key, name=f"{base.name} (calibrated)", aliases=(),
        kernel_launch_us=round(launch_us, 4),
        memory_efficiency=round(base.memory_efficiency / memory_scale, 6),
        tensor_tflops={k: v / compute_scale for k, v in base.tensor_tflops.items()},
        cuda_core_tflops={k: v / compute_scale for k, v in base.cuda_core_tflops.items()},
        sfu_ops_per_clock_per_sm=max(1, round(base.sfu_ops_per_clock_per_sm / compute_scale)))


def device_file_text(result: Fit, source: str = "") -> str:
    """A device file in ``devices.json``'s form, one entry (``--target FILE`` loads it)."""
    d = dataclasses.asdict(result.spec)
    key = d.pop("key")
    d["aliases"] = list(d["aliases"])
    d["_calibration"] = {"launch_us": result.launch_us, "memory_scale": result.memory_scale,
                         "compute_scale": result.compute_scale, "before": result.before,
                         "after": result.after, "kind_residuals": result.kind_residuals,
                         "source": source}
    return json.dumps({key: d}, indent=1, sort_keys=True) + "\n"

"""``hlotk calibrate`` and ``hlotk explain-fusion --measured``: the cost model against what
kernels measured on the user's GPU.

Measurements come from the calibration records (``$HLOTK_CACHE_DIR/calibration/
records.jsonl``: every kernel autotuning or ``exe.profile`` timed, beside its prediction).
``calibrate`` adds a few microbenchmarks when a GPU is there (streaming kernels from 16 KiB
to 256 MiB, row reductions, a bf16 GEMM with an epilogue: each compiled by hlotk and timed
kernel by kernel), fits the device coefficients (``passes/fusion/calibration.py``) and
writes a device file that ``--target`` accepts.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional, Sequence, TextIO

from hlo.errors import HlotkError
from passes.fusion import calibration as cal
from passes.fusion.cost_model import get_device


class CalibrationError(HlotkError):
    """Nothing to calibrate on, or a record file that cannot be read."""


def microbenchmarks() -> list[tuple[str, Any, tuple]]:
    """(name, function, arguments): kernels of each kind over a range of sizes."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    r = np.random.default_rng(0)
    progs: list[tuple[str, Any, tuple]] = []
    for n in (1 << 12, 1 << 16, 1 << 20, 1 << 23, 1 << 26):
        x = r.standard_normal(n, dtype=np.float32)
        progs.append((f"stream{n}", lambda x: jnp.tanh(x) * 2 + 1, (x,)))
    for rows, cols in ((1024, 1024), (8192, 4096)):
        x = r.standard_normal((rows, cols), dtype=np.float32)
        progs.append((f"softmax{rows}x{cols}", lambda x: jax.nn.softmax(x, -1), (x,)))
    for n in (1024, 4096):
        a = r.standard_normal((n, n)).astype(jnp.bfloat16)
        progs.append((f"gemm{n}", lambda a, b: jax.nn.relu(a @ b) * 2, (a, a)))
    return progs


def run_microbenchmarks(target: str, out: Optional[TextIO] = None) -> int:
    """Compile and profile each microbenchmark on the GPU (profiles are recorded)."""
    import jax
    import runtime
    from runtime.cuda import executable_of
    done = 0
    for name, fn, args in microbenchmarks():
        try:
            compiled = runtime.jit(fn, backend="cuda", target=target).lower(*args).compile()
            executable_of(compiled).profile(list(jax.device_put(args)), reps=20)
            done += 1
        except Exception as e:  # noqa: BLE001  (one failing program must not stop the rest)
            if out is not None:
                out.write(f"  {name}: skipped ({type(e).__name__}: {str(e)[:120]})\n")
    return done


def calibrate(target: str, record_files: Sequence[str], output: str, run: bool,
              device: Optional[str], out: TextIO) -> cal.Fit:
    from codegen.triton.autotune import device_name, records_path
    base = get_device(target)
    if run:
        n = run_microbenchmarks(base.key, out)
        out.write(f"microbenchmarks: {n} programs profiled\n")
    files = list(record_files) or [str(records_path())]
    try:
        records = cal.load_records(files)
    except (OSError, ValueError) as e:
        raise CalibrationError(f"cannot read calibration records: {e}") from None
    device = device or (device_name() if run else None)
    points = cal.kernel_points(records, base, device)
    if len(points) < 3:
        raise CalibrationError(f"{len(points)} measured kernels in {', '.join(files)}"
                               f"{f' for {device}' if device else ''}: need at least 3 (run "
                               "programs with HLOTK_AUTOTUNE=1 or exe.profile on the GPU, or "
                               "calibrate there)")
    result = cal.fit(points, base)
    from .dump import atomic_write
    atomic_write(Path(output), cal.device_file_text(result, ", ".join(files)))
    b, a = result.before, result.after
    out.write(f"{len(points)} kernels: |log(predicted/measured)| median {b['median']:.3f} -> "
              f"{a['median']:.3f}, worst {b['worst']:.3f} -> {a['worst']:.3f}\n"
              f"launch {base.kernel_launch_us:.2f} -> {result.launch_us:.2f} us, memory "
              f"efficiency {base.memory_efficiency:.3f} -> {result.spec.memory_efficiency:.3f}, "
              f"compute rates / {result.compute_scale:.3f}\n"
              "per kind, median log(measured/predicted) after: " + ", ".join(
                  f"{k} {v:+.2f}" for k, v in result.kind_residuals.items()) + "\n"
              f"device file: {output} (use --target {output})\n")
    return result


def measured_us_by_key(records: Sequence[dict]) -> dict[str, float]:
    best: dict[str, float] = {}
    for r in records:
        us = r.get("measured_us")
        if us and (r["key"] not in best or us < best[r["key"]]):
            best[r["key"]] = us
    return best


def measured_table(fused: Any, report: Any, target: str, records: Sequence[dict]) -> str:
    """Predicted and measured µs per fusion of ``fused``, then per rejected pair whose two
    kernels were both measured (their measured time apart beside the predicted)."""
    from codegen.triton import TritonCodegenError, compile_fusion
    from passes.fusion.cost_model import predict
    measured = measured_us_by_key(records)
    spec = get_device(target)
    kernel_of: dict[str, str] = {}          # instruction name -> fusion name
    rows = ["| fusion instruction | kernel | predicted µs | measured µs | log(pred/meas) |",
            "|---|---|---|---|---|"]
    times: dict[str, float] = {}
    for inst in fused.entry.instructions:
        if inst.opcode != "fusion":
            continue
        for i in inst.attrs["calls"].instructions:
            kernel_of[i.name] = inst.name
        try:
            k = compile_fusion(inst, target=spec.key)
        except TritonCodegenError:
            continue
        pred = predict(inst, spec).time_us
        meas = measured.get(k.key)
        if meas is not None:
            times[inst.name] = meas
        rows.append(f"| {inst.name} | {k.name} | {pred:.2f} | "
                    + (f"{meas:.2f} | {math.log(pred / meas):+.2f} |" if meas else "- | - |"))
    pairs = ["", "| rejected pair | reason | predicted µs apart / fused | measured µs apart |",
             "|---|---|---|---|"]
    shown = 0
    for d in report.final_edges():
        if d.fused:
            continue
        a, b = kernel_of.get(d.producer), kernel_of.get(d.consumer)
        if a is None or b is None or a == b or a not in times or b not in times:
            continue
        pairs.append(f"| {d.producer} -> {d.consumer} | {d.reason} | {d.unfused_us:.2f} / "
                     f"{d.fused_us:.2f} | {times[a] + times[b]:.2f} |")
        shown += 1
    return "\n".join(rows + (pairs if shown else ["", "(no rejected pair with both kernels "
                                                   "measured)"])) + "\n"
